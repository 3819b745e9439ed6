// Pipeline schedules drawn at random (capscope/pipeline/): every shape the rules accept completes
// on one shared communicator grouped as Megatron groups it, and paired on the communicators chosen
// for it, or is refused (PP6) where the issuer's per-edge send waits would close a cycle; and its
// slots stop growing once the microbatches pass a full warmup.

#include "pipeline_shapes.hpp"

#include <capscope/pipeline.hpp>

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

using namespace capscope;
using namespace capscope::pipeline;
using namespace pipeline_shapes;

TEST_CASE("replay, every shape the rules accept: it completes on the communicators chosen or is refused, and memory stays flat") {
    std::mt19937 rng(11);
    int checked = 0, refused = 0;
    for (int trial = 0; trial < 300; ++trial) {
        const schedule_shape s = random_shape(rng, 7, 4, 3);
        const int p = s.ranks, v = s.virtual_stages;
        const schedule_kind kind = s.kind;
        const int m = 1 + int(rng() % unsigned(4 * p));
        if (check_shape(s, m) != schedule_rule::none) continue;
        INFO(std::string(name_of(kind)) << ", " << p << " ranks, " << v << " chunks, group " << s.group << ", " << m << " microbatches");
        CHECK(check_replay(s, m, communicator_layout::shared).completes()); // grouped as Megatron does: one communicator
        // Paired pass by pass: per edge where one communicator would deadlock. There a pass that
        // computes a send waits for the edge's previous send (its buffer may be the same), which
        // can close a cycle: refused (PP6), and only where the plain per-edge check completes,
        // interleaved in groups larger than the ranks.
        if (const communicator_plan plan = choose_communicators(grouped(s, paired), m); !plan.verdict.completes()) {
            CHECK(plan.layout == communicator_layout::per_edge);
            CHECK(kind == schedule_kind::interleaved_1f1b);
            CHECK(s.group_size() > p);
            CHECK(check_replay(grouped(s, paired), m, communicator_layout::per_edge).completes());
            ++refused;
        }
        // Fewer microbatches than a full warmup need fewer slots; past it, no more.
        if (kind != schedule_kind::gpipe)
            for (int r = 0; r < p; ++r) {
                const std::vector<int> few = plan_slots(s, r, m).slots, more = plan_slots(s, r, m + 8 * s.group_size()).slots;
                CHECK(more == plan_slots(s, r, m + 16 * s.group_size()).slots);
                for (std::size_t c = 0; c < few.size(); ++c) CHECK(few[c] <= more[c]);
            }
        ++checked;
    }
    CHECK(checked > 100);
    CHECK(refused > 0);
}

