#pragma once
//! @file
//! How a rank issues its program on a communicator per edge (pure host): which edges the ranks
//! use, the rank's groups cut into parts (a group's operations on one edge), which parts each
//! pass waits for (those holding its receives), and which sends each pass computes (whose buffer
//! it writes, so that it waits for an earlier send of the same buffer). This is the contract
//! `check_replay` simulates for `communicator_layout::per_edge` (replay_check.hpp);
//! `capscope/parallel/pipeline_p2p.hpp` issues it.

#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::pipeline {

//! A directed rank-to-rank edge and kind of traffic: `replay_check`'s per-edge lane.
struct p2p_edge {
    int lane = 0;
    int from = 0, to = 0;
    carries what = carries::activation;
};

//! A group's operations on one edge, issued together after pass `after` (-1: before the first).
struct edge_part {
    int after = -1;
    int lane = 0;
    group_ops ops;
};

//! A send whose buffer a pass writes: operation `op` of part `part`.
struct part_send {
    int part = 0;
    std::size_t op = 0;
};

struct edge_plan {
    std::vector<p2p_edge> edges;                    //!< every edge any rank uses, by lane: the order every rank splits them in
    std::vector<edge_part> parts;                   //!< this rank's, in issue order
    std::vector<std::vector<int>> receives_for;     //!< per pass: the parts holding what it receives
    std::vector<std::vector<part_send>> sends_of;   //!< per pass: the sends of what it computes
};

//! The per-edge plan of rank `rank` among `programs` (every rank's, `programs_of`).
inline edge_plan plan_edges(const schedule_shape& s, const std::vector<rank_program>& programs, int rank) {
    if (rank < 0 || rank >= int(programs.size()))
        throw std::out_of_range("capscope pipeline: plan_edges for rank " + std::to_string(rank) + " of " + std::to_string(programs.size()));
    constexpr communicator_layout per_edge = communicator_layout::per_edge;
    edge_plan out;
    const int lanes = detail::lane_count(s, per_edge);
    std::vector<bool> used(std::size_t(lanes), false);
    for (const rank_program& p : programs)
        for (const p2p_group& g : p.groups)
            for (const p2p_op& op : g.ops) used[std::size_t(detail::lane_of(s, per_edge, op))] = true;
    for (int lane = 0; lane < lanes; ++lane)
        if (used[std::size_t(lane)]) out.edges.push_back({lane, lane / 2 / s.ranks, lane / 2 % s.ranks, lane % 2 ? carries::gradient : carries::activation});

    const rank_program& program = programs[std::size_t(rank)];
    const int n = int(program.compute.size()), chunks = s.virtual_stages;
    int microbatches = 0;
    for (const compute_action& a : program.compute) microbatches = std::max(microbatches, a.microbatch + 1);
    std::vector<int> pass_at(std::size_t(2 * chunks * microbatches), -1);
    auto key = [&](pass d, int chunk, int mb) { return std::size_t(((d == pass::forward ? 0 : 1) * chunks + chunk) * microbatches + mb); };
    for (int k = 0; k < n; ++k) {
        const compute_action& a = program.compute[std::size_t(k)];
        pass_at[key(a.direction, a.chunk, a.microbatch)] = k;
    }
    // The pass that runs the forward (an activation) or backward (a gradient) of `stage`'s microbatch.
    auto pass_of = [&](bool activation, int stage, int mb) {
        const int chunk = s.chunk_of(stage);
        const int at = chunk >= 0 && chunk < chunks && mb >= 0 && mb < microbatches ? pass_at[key(activation ? pass::forward : pass::backward, chunk, mb)] : -1;
        if (at < 0)
            throw std::invalid_argument("capscope pipeline: rank " + std::to_string(rank) + " sends or receives for stage " + std::to_string(stage) +
                                        ", microbatch " + std::to_string(mb) + ", whose pass it does not run");
        return at;
    };
    out.receives_for.assign(std::size_t(n), {});
    out.sends_of.assign(std::size_t(n), {});
    for (const p2p_group& g : program.groups)
        for (std::size_t first = 0; first < g.ops.size(); ++first) {
            const int lane = detail::lane_of(s, per_edge, g.ops[first]);
            bool placed = false; // an earlier operation of the group on the same edge took it
            for (std::size_t i = 0; i < first; ++i) placed = placed || detail::lane_of(s, per_edge, g.ops[i]) == lane;
            if (placed) continue;
            edge_part part{g.after, lane, {}};
            const int index = int(out.parts.size());
            for (std::size_t i = first; i < g.ops.size(); ++i) {
                const p2p_op& op = g.ops[i];
                if (detail::lane_of(s, per_edge, op) != lane) continue;
                const bool activation = op.m.what == carries::activation;
                if (op.send) // computed by the forward of the stage before it, or the backward of the one after
                    out.sends_of[std::size_t(pass_of(activation, activation ? op.m.stage - 1 : op.m.stage + 1, op.m.microbatch))].push_back(
                        {index, part.ops.size()});
                else out.receives_for[std::size_t(pass_of(activation, op.m.stage, op.m.microbatch))].push_back(index);
                part.ops.push_back(op);
            }
            out.parts.push_back(part);
        }
    return out;
}

} // namespace capscope::pipeline
