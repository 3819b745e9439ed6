// The per-edge plan (capscope/pipeline/edge_plan.hpp): how a rank issues its program on a
// communicator per edge, pass by pass, as the replay check simulated it.

#include "pipeline_shapes.hpp"

#include <capscope/pipeline.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace capscope;
using namespace capscope::pipeline;

using namespace pipeline_shapes;

TEST_CASE("the per-edge plan: every send and receive in one part on its edge, each pass waiting for the parts of its receives") {
    // For each rank of each shape: the parts cover the groups' operations once, in program order
    // per edge; a receive's part is issued before the pass that consumes it and is among that
    // pass's waits; a send's part is issued after the pass that computes it and is among that
    // pass's sends. The ranks agree on the edges (every rank splits them in that order).
    int cases = 0;
    auto pass_index = [](const rank_program& p, pass d, int chunk, int mb) {
        for (std::size_t k = 0; k < p.compute.size(); ++k)
            if (p.compute[k] == compute_action{d, chunk, mb}) return int(k);
        return -1;
    };
    for (int ranks : {2, 4})
        for (const schedule_shape& base : {one_f_one_b(ranks), interleaved(ranks, 2)})
            for (p2p_grouping g : {p2p_grouping::megatron, paired, one_by_one})
                for (int m : {ranks, 2 * ranks, 3 * ranks}) {
                    const schedule_shape s = grouped(base, g);
                    if (check_shape(s, m) != schedule_rule::none) continue;
                    const std::vector<rank_program> programs = programs_of(s, m);
                    std::vector<p2p_edge> first_edges;
                    for (int r = 0; r < ranks; ++r) {
                        INFO(name_of(s.kind), " ", ranks, " ranks, grouping ", int(g), ", ", m, " microbatches, rank ", r);
                        const edge_plan plan = plan_edges(s, programs, r);
                        if (r == 0) first_edges = plan.edges;
                        CHECK(plan.edges.size() == first_edges.size());
                        for (std::size_t e = 0; e < std::min(plan.edges.size(), first_edges.size()); ++e) CHECK(plan.edges[e].lane == first_edges[e].lane);
                        const rank_program& p = programs[std::size_t(r)];
                        std::size_t ops = 0, covered = 0;
                        for (const p2p_group& grp : p.groups) ops += grp.ops.size();
                        std::vector<int> last_after_on_lane(std::size_t(capscope::pipeline::detail::lane_count(s, communicator_layout::per_edge)), -2);
                        for (std::size_t i = 0; i < plan.parts.size(); ++i) {
                            const edge_part& part = plan.parts[i];
                            covered += part.ops.size();
                            CHECK(part.after >= last_after_on_lane[std::size_t(part.lane)]); // in program order on its edge
                            last_after_on_lane[std::size_t(part.lane)] = part.after;
                            for (std::size_t o = 0; o < part.ops.size(); ++o) {
                                const p2p_op& op = part.ops[o];
                                CHECK(capscope::pipeline::detail::lane_of(s, communicator_layout::per_edge, op) == part.lane);
                                CHECK((op.m.from == r || op.m.to == r));
                                const bool act = op.m.what == carries::activation;
                                if (!op.send) {
                                    const int consumer = pass_index(p, act ? pass::forward : pass::backward, s.chunk_of(op.m.stage), op.m.microbatch);
                                    REQUIRE(consumer >= 0);
                                    CHECK(part.after < consumer);
                                    const auto& waits = plan.receives_for[std::size_t(consumer)];
                                    CHECK(std::find(waits.begin(), waits.end(), int(i)) != waits.end());
                                } else {
                                    const int producer =
                                        pass_index(p, act ? pass::forward : pass::backward, s.chunk_of(act ? op.m.stage - 1 : op.m.stage + 1), op.m.microbatch);
                                    REQUIRE(producer >= 0);
                                    CHECK(part.after >= producer);
                                    const auto& sends = plan.sends_of[std::size_t(producer)];
                                    CHECK(std::find_if(sends.begin(), sends.end(), [&](const part_send& x) { return x.part == int(i) && x.op == o; }) != sends.end());
                                }
                            }
                        }
                        CHECK(covered == ops);
                        ++cases;
                    }
                }
    CHECK(cases > 40);
    // 1F1B one by one on 2 ranks: activations 0 -> 1 and gradients 1 -> 0, an edge each; paired
    // interleaved also sends activations back to rank 0 (its second chunk) and gradients to rank 1.
    const edge_plan two = plan_edges(grouped(one_f_one_b(2), one_by_one), programs_of(grouped(one_f_one_b(2), one_by_one), 4), 0);
    REQUIRE(two.edges.size() == 2);
    CHECK((two.edges[0].from == 0 && two.edges[0].to == 1 && two.edges[0].what == carries::activation));
    CHECK((two.edges[1].from == 1 && two.edges[1].to == 0 && two.edges[1].what == carries::gradient));
    CHECK(plan_edges(grouped(interleaved(2, 2), paired), programs_of(grouped(interleaved(2, 2), paired), 4), 0).edges.size() == 4);
}

TEST_CASE("per edge, a send's buffer reused: the pass that computes a send waits for the edge's previous send, and the check holds that wait") {
    // pipeline_p2p's issuer makes a pass that overwrites a buffer wait for the send reading it.
    // With an edge's sends from one buffer (its worst case), interleaved paired in groups of 3 on
    // 2 ranks would hang at 6 microbatches: a cycle through a gradient send waiting for its
    // buffer's previous send, whose receive rank 1 posts only after a forward that waits in turn.
    const schedule_shape looped = grouped({schedule_kind::interleaved_1f1b, 2, 2, 4, 3}, paired);
    CHECK(check_replay(looped, 6, communicator_layout::per_edge, send_buffers::own).completes());
    const replay_verdict reused = check_replay(looped, 6, communicator_layout::per_edge, send_buffers::one_per_edge);
    CHECK(reused.result == replay_verdict::outcome::deadlocks);
    CHECK(describe(reused).find("sends the gradient of microbatch 1 for stage 1") != std::string::npos);
    // 1F1B one by one, and interleaved paired in groups of the ranks, complete either way.
    for (int m : {2, 4, 8}) {
        CHECK(check_replay(grouped(one_f_one_b(2), one_by_one), m, communicator_layout::per_edge, send_buffers::one_per_edge).completes());
        CHECK(check_replay(grouped(one_f_one_b(4), one_by_one), 2 * m, communicator_layout::per_edge, send_buffers::one_per_edge).completes());
    }
    CHECK(check_replay(grouped(interleaved(2, 2), paired), 4, communicator_layout::per_edge, send_buffers::one_per_edge).completes());
    // On one shared stream every send completes before the next pass: the buffers change nothing.
    CHECK(check_replay(interleaved(2, 2), 4, communicator_layout::shared, send_buffers::one_per_edge).completes());
}
