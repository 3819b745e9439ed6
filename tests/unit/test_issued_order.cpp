// The plan verifier over a pipeline step as issued (capscope/pipeline/issued_order.hpp): with
// buffers laid out as a model lays them out (plan_slots' activation and gradient slots, a send
// buffer per chunk and kind), every shape the rules accept is ordered, on one communicator and per
// edge; a slot too few, a pass that does not wait for its receive, one buffer for two operations
// of a group, and a send buffer that a later pass rewrites unwaited are each found, named.

#include "pipeline_shapes.hpp"

#include <capscope/pipeline.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace capscope;
using namespace capscope::pipeline;
using namespace pipeline_shapes;

namespace {

//! A model's buffers, as addresses only: activation slot k of chunk c, gradient slot k, and a
//! send buffer per chunk and kind, each 64 bytes apart. `fewer` takes that many activation slots
//! away (microbatches then share them, as a wrong slot plan would).
struct model_buffers {
    const schedule_shape& s;
    int rank;
    std::map<std::tuple<int, int>, int> activation_slot, gradient_slot; // (chunk, microbatch) -> slot
    std::vector<int> slots;
    int fewer = 0;
    bool one_send_buffer = false; //!< every send of the rank from one buffer
    bool send_per_rank = false;   //!< one send buffer per kind for every chunk (the toy of tests/mpi), else per chunk and kind (gpt::pipeline_model)

    model_buffers(const schedule_shape& shape, int r, int microbatches) : s(shape), rank(r) {
        const slot_plan plan = plan_slots(shape, r, microbatches);
        for (const slot_use& u : plan.uses) activation_slot[{u.chunk, u.microbatch}] = u.slot;
        for (const gradient_use& g : plan.gradients) gradient_slot[{g.chunk, g.microbatch}] = g.slot;
        slots = plan.slots;
    }
    p2p_buffer operator()(const p2p_op& op) const {
        auto at = [](std::uintptr_t offset) { return p2p_buffer{reinterpret_cast<void*>(0x100000 + offset * 64), 64}; };
        const bool activation = op.m.what == carries::activation;
        if (op.send) {
            if (one_send_buffer) return at(0);
            const int from_stage = activation ? op.m.stage - 1 : op.m.stage + 1;
            return at(1 + 2 * std::uintptr_t(send_per_rank ? 0 : s.chunk_of(from_stage)) + (activation ? 0 : 1));
        }
        const int chunk = s.chunk_of(op.m.stage);
        if (activation) {
            const int n = std::max(1, slots[std::size_t(chunk)] - fewer);
            return at(1000 + 100 * std::uintptr_t(chunk) + std::uintptr_t(activation_slot.at({chunk, op.m.microbatch}) % n));
        }
        return at(5000 + std::uintptr_t(gradient_slot.at({chunk, op.m.microbatch})));
    }
};

std::optional<std::string> check(const schedule_shape& s, int rank, int m, const model_buffers& buffers, bool drop_receive_waits = false,
                                 bool drop_send_waits = false) {
    const communicator_plan chosen = choose_communicators(s, m);
    const rank_program program = program_of(s, rank, m);
    if (chosen.layout == communicator_layout::shared) return check_issued_order(s, program, chosen.layout, nullptr, buffers);
    edge_plan edges = plan_edges(s, programs_of(s, m), rank);
    if (drop_receive_waits)
        for (auto& w : edges.receives_for) w.clear();
    if (drop_send_waits)
        for (auto& w : edges.sends_of) w.clear();
    return check_issued_order(s, program, chosen.layout, &edges, buffers);
}

} // namespace

TEST_CASE("issued order: every shape the rules accept, on the communicators chosen for it, is ordered with plan_slots' buffers") {
    std::mt19937 rng(23);
    int shared = 0, per_edge = 0;
    for (int trial = 0; trial < 160; ++trial) {
        schedule_shape s = random_shape(rng, 5, 3, 2);
        const int p = s.ranks, v = s.virtual_stages;
        const schedule_kind kind = s.kind;
        if (rng() % 2) s.grouping = kind == schedule_kind::interleaved_1f1b ? paired : one_by_one;
        const int m = 1 + int(rng() % unsigned(3 * p));
        if (check_shape(s, m) != schedule_rule::none || !choose_communicators(s, m).verdict.completes()) continue;
        (choose_communicators(s, m).layout == communicator_layout::shared ? shared : per_edge)++;
        for (int r = 0; r < p; ++r) {
            INFO(std::string(name_of(kind)) << ", " << p << " ranks, " << v << " chunks, group " << s.group << ", " << m << " microbatches, "
                                             << std::string(name_of(s.grouping)) << ", rank " << r);
            model_buffers buffers(s, r, m);
            const std::optional<std::string> found = check(s, r, m, buffers);
            CHECK_MESSAGE(!found, found.value_or(""));
            buffers.send_per_rank = true;
            const std::optional<std::string> per_rank = check(s, r, m, buffers);
            CHECK_MESSAGE(!per_rank, per_rank.value_or(""));
        }
    }
    CHECK(shared > 30);
    CHECK(per_edge > 10);
}

TEST_CASE("issued order: the phase layout's slots (microbatch k in slot k mod S) are ordered for every count the phases serve") {
    for (const schedule_shape& s : {one_f_one_b(2), one_f_one_b(4), interleaved(2, 2), interleaved(4, 2), interleaved(3, 3)})
        for (int r = 0; r < s.ranks; ++r) {
            const phase_layout l = phase_layout_of(s, r);
            auto slots = [&](const p2p_op& op) {
                auto at = [](std::uintptr_t offset) { return p2p_buffer{reinterpret_cast<void*>(0x100000 + offset * 64), 64}; };
                const bool activation = op.m.what == carries::activation;
                if (op.send) return at(1 + 2 * std::uintptr_t(s.chunk_of(activation ? op.m.stage - 1 : op.m.stage + 1)) + (activation ? 0 : 1));
                const int chunk = s.chunk_of(op.m.stage);
                return activation ? at(1000 + 100 * std::uintptr_t(chunk) + std::uintptr_t(l.activation_slot(chunk, op.m.microbatch)))
                                  : at(5000 + std::uintptr_t(l.gradient_slot(chunk, op.m.microbatch)));
            };
            for (int m = l.least_microbatches; m <= l.least_microbatches + 4 * l.group; m += l.group) {
                INFO(std::string(name_of(s.kind)) << ", " << s.ranks << " ranks, " << s.virtual_stages << " chunks, rank " << r << ", " << m << " microbatches");
                const std::optional<std::string> found = check_issued_order(s, program_of(s, r, m), communicator_layout::shared, nullptr, slots);
                CHECK_MESSAGE(!found, found.value_or(""));
            }
        }
}

TEST_CASE("issued order: a slot too few is found, on one communicator and per edge") {
    // Rank 1: its chunks receive their activations (rank 0's first chunk reads tokens instead).
    for (const schedule_shape& s : {one_f_one_b(4), grouped(one_f_one_b(4), one_by_one), interleaved(2, 2), grouped(interleaved(2, 2), paired)}) {
        const int m = 8;
        model_buffers wrong(s, 1, m);
        REQUIRE(wrong.slots[0] > 1);
        CHECK_FALSE(check(s, 1, m, wrong));
        wrong.fewer = 1;
        const std::optional<std::string> found = check(s, 1, m, wrong);
        REQUIRE(found);
        CHECK(found->find("capscope pipeline: rank 1's step as issued lets the receive of the activation of microbatch ") == 0);
        CHECK(found->find(" overwrite the bytes that the receive of the activation of microbatch ") != std::string::npos);
        CHECK(found->find("a slot of its own for every microbatch in flight") != std::string::npos);
    }
}

TEST_CASE("issued order: per edge, a pass that does not wait for its receive is found") {
    const schedule_shape s = grouped(one_f_one_b(2), one_by_one);
    REQUIRE(choose_communicators(s, 4).layout == communicator_layout::per_edge);
    const std::optional<std::string> found = check(s, 1, 4, model_buffers(s, 1, 4), true);
    REQUIRE(found);
    CHECK(found->find("the receive of the activation of microbatch 0 for stage 1 (rank 0 to rank 1)") != std::string::npos);
    CHECK(found->find("the forward of chunk 0, microbatch 0 (its input) run before the receive") != std::string::npos);
}

TEST_CASE("issued order: one buffer for a send and a receive of one group is found; one send buffer per edge is waited for") {
    // Megatron's 1F1B steady state sends and receives in one group (send_forward_recv_backward).
    struct one_for_all {
        p2p_buffer operator()(const p2p_op&) const { return {reinterpret_cast<void*>(0x2000), 64}; }
    };
    const schedule_shape s = one_f_one_b(2);
    const std::optional<std::string> found = check_issued_order(s, program_of(s, 0, 4), communicator_layout::shared, nullptr, one_for_all{});
    REQUIRE(found);
    CHECK(found->find("at once, in one NCCL group") != std::string::npos);
    CHECK(found->find("a buffer of its own for each send and receive of a group") != std::string::npos);
    // Per edge, every send of the last rank from one buffer: a pass that writes it waits for the
    // edge's earlier send of that address (pipeline_p2p::run), so it is ordered.
    const schedule_shape edge = grouped(one_f_one_b(2), one_by_one);
    model_buffers one(edge, 1, 4);
    one.one_send_buffer = true;
    CHECK_FALSE(check(edge, 1, 4, one));
}

TEST_CASE("issued order: per edge, a pass that rewrites a send buffer without waiting for its earlier send is found") {
    // pipeline_p2p::run makes a pass that computes a send wait for the edge's earlier send from
    // that buffer (a send buffer per chunk and kind is rewritten every microbatch). Without it:
    const schedule_shape s = grouped(one_f_one_b(2), one_by_one);
    const model_buffers buffers(s, 0, 4);
    REQUIRE_FALSE(check(s, 0, 4, buffers));
    const std::optional<std::string> found = check(s, 0, 4, buffers, false, true);
    REQUIRE(found);
    CHECK(found->find("the send of the activation of microbatch ") != std::string::npos);
    CHECK(found->find("the forward of chunk 0, microbatch 1 (what it sends)") != std::string::npos);
}

TEST_CASE("issued order: a message twice, a pass's input never received, and buffers that overlap are found") {
    const schedule_shape s = one_f_one_b(2);
    const model_buffers buffers(s, 1, 4);
    rank_program twice = program_of(s, 1, 4);
    twice.groups.push_back(twice.groups.front());
    twice.groups.back().after = int(twice.compute.size()) - 1;
    std::optional<std::string> found = check_issued_order(s, twice, communicator_layout::shared, nullptr, buffers);
    REQUIRE(found);
    CHECK(found->find(" twice -- fix: each send and receive once in a step") != std::string::npos);

    rank_program missing = program_of(s, 1, 4);
    missing.groups.erase(missing.groups.begin()); // rank 1's first receive
    found = check_issued_order(s, missing, communicator_layout::shared, nullptr, buffers);
    REQUIRE(found);
    CHECK(found->find("has nothing that writes what the forward of chunk 0, microbatch 0 (its input) reads") != std::string::npos);

    // Rank 1 of 4 keeps 3 activation slots; slot 1 laid over the second half of slot 0: a receive
    // into slot 1 overwrites part of an activation that slot 0's backward has yet to read.
    const schedule_shape four = one_f_one_b(4);
    struct overlapping {
        model_buffers inner;
        p2p_buffer operator()(const p2p_op& op) const {
            p2p_buffer b = inner(op);
            if (!op.send && op.m.what == carries::activation && inner.activation_slot.at({0, op.m.microbatch}) == 1)
                b.data = static_cast<char*>(b.data) - 32; // 64 bytes apart: now half over slot 0
            return b;
        }
    };
    found = check_issued_order(four, program_of(four, 1, 8), communicator_layout::shared, nullptr, overlapping{model_buffers(four, 1, 8)});
    REQUIRE(found);
    INFO(*found);
    CHECK(found->find("(two buffers that overlap)") != std::string::npos);
}

TEST_CASE("issued order: per edge, a pass that waits for a receive issued after it is refused") {
    const schedule_shape s = grouped(one_f_one_b(2), one_by_one);
    edge_plan edges = plan_edges(s, programs_of(s, 4), 1);
    REQUIRE(edges.parts.size() > 1);
    edges.receives_for[0] = {int(edges.parts.size()) - 1}; // the first forward waits for the last part
    const std::optional<std::string> found = check_issued_order(s, program_of(s, 1, 4), communicator_layout::per_edge, &edges, model_buffers(s, 1, 4));
    REQUIRE(found);
    CHECK(found->find("after the forward of chunk 0, microbatch 0 that reads what they receive") != std::string::npos);
}
