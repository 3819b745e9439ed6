#pragma once
//! @file
//! Will a schedule's sends and receives complete when a graph replays them? Every rank's groups
//! are simulated as replay issues them, before anything runs:
//! - a communicator matches sends and receives between two ranks in the order they were issued
//!   (FIFO), whatever they carry; a receive matched to another message's send is data silently
//!   wrong (`crosses`), and one with no partner never completes (`unmatched`);
//! - a send or receive completes only when its partner is issued too (rendezvous: NCCL buffers
//!   small messages, so a real run may escape a cycle this finds, at one size and not another),
//!   and a group only when all its operations do;
//! - a group is issued after the pass it follows and after the groups before it on its
//!   communicator's stream; a pass waits for the groups that hold its receives.
//! Eager execution may happen to avoid an ordering cycle that replay meets; this is replay's
//! order. Layouts: one communicator for all of a rank's sends and receives; one for activations
//! and one for gradients; or one per directed rank-to-rank edge and kind of traffic, which
//! breaks cycles through unrelated edges and keeps activations and gradients on one edge from
//! crossing.
//!
//! The contract a verdict holds for, which an issuer must keep: each group's operations on one
//! communicator are one NCCL group on that communicator's own stream, in the program's order;
//! a pass waits only for the streams of its receives; a send's buffer is not written again
//! before its send completes. Issuing a group that spans communicators as one NCCL group, or
//! making a pass wait for every operation before it, joins the streams, and is the shared
//! layout's model instead (per_edge verdicts do not carry over).

#include <capscope/pipeline/p2p_program.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::pipeline {

enum class communicator_layout {
    shared,        //!< one communicator, one stream, for every send and receive of a rank
    per_direction, //!< one for activations (forward traffic) and one for gradients (PyTorch's before #195760)
    per_edge,      //!< one communicator (and stream) per directed rank-to-rank edge and kind of traffic:
                   //!< on two ranks one edge carries activations and gradients, in orders that differ
};

//! Where a rank's sends read from, for the per-stream layouts (on one shared stream every send
//! completes before the next pass anyway):
//! - `own`: each send reads a buffer that nothing writes until it has completed;
//! - `one_per_edge`: an edge's sends of one kind of traffic reuse one buffer, so the pass that
//!   computes a send waits for the edge's previous send to complete (pipeline_p2p's issuer waits
//!   where a buffer is reused; this is its worst case).
enum class send_buffers { own, one_per_edge };

constexpr std::string_view name_of(communicator_layout l) {
    return l == communicator_layout::shared ? "shared" : l == communicator_layout::per_direction ? "per-direction" : "per-edge";
}


struct replay_verdict {
    enum class outcome { completes, deadlocks, crosses, unmatched, late, early, missing };
    outcome result = outcome::completes;
    //! deadlocks: `waiting` is issued and cannot complete, because its partner `held` is not
    //! issued: `held`'s rank is held before pass `held_at`, or (`held_by_stream`) behind another
    //! group on its stream. crosses: the communicator matches the send `waiting` with the receive
    //! `held`. unmatched: `waiting` has no partner in the other rank's program. late: the receive
    //! `waiting` is issued after pass `waiting_after`, and no pass after it needs what it brings
    //! (the pass that does ran before it arrived, or there is none). early: the send `waiting` is
    //! issued after pass `waiting_after` (or before the first), before the pass that computes what
    //! it sends. missing: rank `waiting_rank`'s pass `held_at` needs an input that no receive of
    //! its program brings.
    p2p_op waiting{}, held{};
    int waiting_rank = 0, held_rank = 0;
    compute_action waiting_after{}, held_at{};
    bool waiting_before_first = false, held_by_stream = false;
    constexpr bool completes() const { return result == outcome::completes; }
};

namespace detail {

struct replay_part {
    int rank = 0, lane = 0, after = -1;
    int first_op = 0, op_count = 0, ops_done = 0;
    int previous_on_lane = -1, next_on_lane = -1; //!< the parts issued before and after it on its stream
    int feeds[8] = {-1, -1, -1, -1, -1, -1, -1, -1}; //!< the passes (numbered over every rank) that wait for it
    bool issued = false, complete = false;
};
struct replay_op {
    p2p_op op;
    int part = 0, partner = -1;
    bool done = false;
};

//! Makes pass `pass_index` wait for `p` (once).
constexpr void add_feed(replay_part& p, int pass_index) {
    if (pass_index < 0) return;
    int used = 0;
    for (; used < 8 && p.feeds[used] >= 0; ++used)
        if (p.feeds[used] == pass_index) return;
    if (used == 8) throw std::logic_error("capscope pipeline: check_replay: more than eight passes wait for one group");
    p.feeds[used] = pass_index;
}

constexpr int lane_count(const schedule_shape& s, communicator_layout layout) {
    return layout == communicator_layout::shared ? 1 : layout == communicator_layout::per_direction ? 2 : s.ranks * s.ranks * 2;
}
constexpr int lane_of(const schedule_shape& s, communicator_layout layout, const p2p_op& o) {
    if (layout == communicator_layout::shared) return 0;
    if (layout == communicator_layout::per_direction) return o.m.what == carries::activation ? 0 : 1;
    return (o.m.from * s.ranks + o.m.to) * 2 + (o.m.what == carries::gradient ? 1 : 0);
}

} // namespace detail

//! Replays every rank's program on `layout`'s communicators (worklist: each part is issued and
//! completed once, so the cost grows with the operations; in a constant expression, clang++
//! stops at a million steps by default: see docs/pipeline.md). Shared: one stream per rank for
//! its passes and groups, so each pass waits for the group before it. The other layouts: a
//! stream per communicator, and a pass waits for the groups that hold its receives.
constexpr replay_verdict check_replay(const schedule_shape& s, const std::vector<rank_program>& programs, communicator_layout layout,
                                      send_buffers buffers = send_buffers::own) {
    using namespace detail;
    if (int(programs.size()) != s.ranks)
        throw std::invalid_argument("capscope pipeline: check_replay was given " + std::to_string(programs.size()) + " ranks' orders for a schedule of " +
                                    std::to_string(s.ranks) + " ranks -- fix: one order per rank");
    const int lanes = lane_count(s, layout);
    std::vector<int> first_pass(std::size_t(s.ranks) + 1, 0); // passes numbered over every rank
    for (int r = 0; r < s.ranks; ++r) first_pass[std::size_t(r) + 1] = first_pass[std::size_t(r)] + int(programs[std::size_t(r)].compute.size());
    std::vector<replay_part> parts;
    std::vector<replay_op> ops;
    parts.reserve(std::size_t(first_pass.back()) * 2), ops.reserve(std::size_t(first_pass.back()) * 2);
    std::vector<int> lane_last(std::size_t(s.ranks * lanes), -1);
    // Per pass (numbered over every rank, one more per rank for "before the first"): the parts
    // issued after it, [begin, end) in `parts`.
    const std::size_t slots = std::size_t(first_pass.back() + s.ranks);
    std::vector<int> parts_after_begin(slots, 0), parts_after_end(slots, 0);
    for (int r = 0; r < s.ranks; ++r) {
        const rank_program& program = programs[std::size_t(r)];
        const int n = int(program.compute.size());
        // Which pass consumes a receive: its forward (an activation) or backward (a gradient) of
        // the chunk and microbatch it carries.
        int microbatches = 0;
        for (const compute_action& a : program.compute) microbatches = std::max(microbatches, a.microbatch + 1);
        const int chunks = s.virtual_stages;
        std::vector<int> pass_at(std::size_t(2 * chunks * microbatches), -1); // (direction, chunk, microbatch) -> pass
        auto key = [&](pass d, int chunk, int mb) { return std::size_t(((d == pass::forward ? 0 : 1) * chunks + chunk) * microbatches + mb); };
        for (int k = 0; k < n; ++k) {
            const compute_action& a = program.compute[std::size_t(k)];
            if (a.chunk >= 0 && a.chunk < chunks && a.microbatch >= 0) pass_at[key(a.direction, a.chunk, a.microbatch)] = k;
        }
        auto consumer = [&](const p2p_op& o) {
            const int chunk = s.chunk_of(o.m.stage);
            if (chunk < 0 || chunk >= chunks || o.m.microbatch < 0 || o.m.microbatch >= microbatches) return -1;
            const int k = pass_at[key(o.m.what == carries::activation ? pass::forward : pass::backward, chunk, o.m.microbatch)];
            return k < 0 ? -1 : first_pass[std::size_t(r)] + k;
        };
        // The pass that computes what a send carries: the forward of the stage before (an
        // activation) or the backward of the stage after (a gradient); n when the rank has none.
        auto producer = [&](const p2p_op& o) {
            const int stage = o.m.what == carries::activation ? o.m.stage - 1 : o.m.stage + 1;
            const int chunk = s.chunk_of(stage);
            if (stage < 0 || chunk >= chunks || o.m.microbatch < 0 || o.m.microbatch >= microbatches) return n;
            const int k = pass_at[key(o.m.what == carries::activation ? pass::forward : pass::backward, chunk, o.m.microbatch)];
            return k < 0 ? n : k;
        };
        std::vector<int> received(std::size_t(n), 0); // per pass: receives that bring its input
        std::vector<int> last_send_part(std::size_t(lanes), -1); // per stream: the part of its latest send
        std::size_t g = 0;
        for (int after = -1; after < n; ++after) {
            const std::size_t slot = std::size_t(first_pass[std::size_t(r)] + r + after + 1);
            parts_after_begin[slot] = int(parts.size());
            for (; g < program.groups.size() && program.groups[g].after == after; ++g) {
                const p2p_group& group = program.groups[g];
                // One part per stream the group's operations go to.
                for (std::size_t first = 0; first < group.ops.size(); ++first) {
                    const int lane = lane_of(s, layout, group.ops[first]);
                    bool placed = false; // an earlier operation of the group on the same stream took it
                    for (std::size_t i = 0; i < first; ++i) placed = placed || lane_of(s, layout, group.ops[i]) == lane;
                    if (placed) continue;
                    replay_part part{r, lane, after, int(ops.size())};
                    auto feed = [&](int pass_index) { add_feed(part, pass_index); };
                    bool sends_here = false;
                    if (layout == communicator_layout::shared && after + 1 < n) feed(first_pass[std::size_t(r)] + after + 1);
                    for (std::size_t i = first; i < group.ops.size(); ++i) {
                        const p2p_op& o = group.ops[i];
                        if (lane_of(s, layout, o) != lane) continue;
                        if (!o.send && consumer(o) <= first_pass[std::size_t(r)] + after) { // its pass ran without it
                            replay_verdict late;
                            late.result = replay_verdict::outcome::late;
                            late.waiting = o, late.waiting_rank = r, late.waiting_before_first = after < 0;
                            if (after >= 0) late.waiting_after = program.compute[std::size_t(after)];
                            return late;
                        }
                        if (o.send && producer(o) > after) { // it would send what is not computed yet
                            replay_verdict early;
                            early.result = replay_verdict::outcome::early;
                            early.waiting = o, early.waiting_rank = r, early.waiting_before_first = after < 0;
                            if (after >= 0) early.waiting_after = program.compute[std::size_t(after)];
                            return early;
                        }
                        if (o.send && buffers == send_buffers::one_per_edge && layout != communicator_layout::shared) {
                            // The pass computing it overwrites the buffer the edge's previous send reads.
                            if (const int previous = last_send_part[std::size_t(lane)]; previous >= 0)
                                add_feed(parts[std::size_t(previous)], first_pass[std::size_t(r)] + producer(o));
                            sends_here = true;
                        }
                        if (!o.send) ++received[std::size_t(consumer(o) - first_pass[std::size_t(r)])];
                        if (!o.send && layout != communicator_layout::shared) feed(consumer(o));
                        ops.push_back({o, int(parts.size()), -1, false});
                        ++part.op_count;
                    }
                    if (sends_here) last_send_part[std::size_t(lane)] = int(parts.size());
                    int& last = lane_last[std::size_t(r * lanes + lane)];
                    if (last >= 0) parts[std::size_t(last)].next_on_lane = int(parts.size());
                    part.previous_on_lane = last;
                    last = int(parts.size());
                    parts.push_back(part);
                }
            }
            parts_after_end[slot] = int(parts.size());
        }
        if (g != program.groups.size())
            throw std::invalid_argument("capscope pipeline: rank " + std::to_string(r) + "'s groups are not in the order of the passes they follow, "
                                        "or follow a pass it does not have -- fix: groups sorted by `after`, each in [-1, passes)");
        for (int k = 0; k < n; ++k) { // every pass that takes an input from another stage receives it
            const compute_action& a = program.compute[std::size_t(k)];
            const int stage = s.stage_of(r, a.chunk);
            if ((a.direction == pass::forward ? stage > 0 : stage < s.stages() - 1) && received[std::size_t(k)] == 0) {
                replay_verdict missing;
                missing.result = replay_verdict::outcome::missing;
                missing.waiting_rank = r, missing.held_at = a;
                return missing;
            }
        }
    }
    // A communicator matches the k-th send from a to b with the k-th receive at b from a: sort
    // each side by (pair of ranks, communicator), keeping issue order (counting sort).
    // (A per-edge lane is one pair of ranks already.)
    const bool lane_is_pair = layout == communicator_layout::per_edge;
    const std::size_t keys = std::size_t(lane_is_pair ? lanes : s.ranks * s.ranks * lanes);
    auto key_of = [&](const replay_op& o) {
        const int lane = parts[std::size_t(o.part)].lane;
        return std::size_t(lane_is_pair ? lane : (o.op.m.from * s.ranks + o.op.m.to) * lanes + lane);
    };
    std::vector<int> send_start(keys + 1, 0), receive_start(keys + 1, 0);
    for (const replay_op& o : ops) ++(o.op.send ? send_start : receive_start)[key_of(o) + 1];
    for (std::size_t k = 0; k < keys; ++k) send_start[k + 1] += send_start[k], receive_start[k + 1] += receive_start[k];
    std::vector<int> sends(static_cast<std::size_t>(send_start[keys]), 0), receives(static_cast<std::size_t>(receive_start[keys]), 0); // (n, 0): clang 14 cannot default-fill in a constant expression
    {
        std::vector<int> send_at(send_start.begin(), send_start.end() - 1), receive_at(receive_start.begin(), receive_start.end() - 1);
        for (int i = 0; i < int(ops.size()); ++i) {
            const std::size_t key = key_of(ops[std::size_t(i)]);
            if (ops[std::size_t(i)].op.send) sends[std::size_t(send_at[key]++)] = i;
            else receives[std::size_t(receive_at[key]++)] = i;
        }
    }
    replay_verdict v;
    for (std::size_t key = 0; key < keys; ++key)
        for (int k = 0; k < send_start[key + 1] - send_start[key] && k < receive_start[key + 1] - receive_start[key]; ++k) {
            const int si = sends[std::size_t(send_start[key] + k)], ri = receives[std::size_t(receive_start[key] + k)];
            replay_op &a = ops[std::size_t(si)], &b = ops[std::size_t(ri)];
            if (!(a.op.m == b.op.m)) {
                v.result = replay_verdict::outcome::crosses;
                v.waiting = a.op, v.held = b.op, v.waiting_rank = a.op.m.from, v.held_rank = b.op.m.to;
                return v;
            }
            a.partner = ri, b.partner = si;
        }
    // An operation whose count on its communicator the other side does not match never completes.
    for (std::size_t key = 0; key < keys; ++key) {
        const int sent = send_start[key + 1] - send_start[key], received = receive_start[key + 1] - receive_start[key];
        if (sent == received) continue;
        const replay_op& alone = ops[std::size_t(sent > received ? sends[std::size_t(send_start[key] + received)] : receives[std::size_t(receive_start[key] + sent)])];
        v.result = replay_verdict::outcome::unmatched;
        v.waiting = alone.op, v.waiting_rank = parts[std::size_t(alone.part)].rank, v.held_rank = alone.op.send ? alone.op.m.to : alone.op.m.from;
        return v;
    }

    std::vector<int> receiving(std::size_t(first_pass.back()) + 1, 0); // per pass: parts it waits for, not complete
    for (const replay_part& p : parts)
        for (int f : p.feeds)
            if (f >= 0) ++receiving[std::size_t(f)];
    std::vector<int> passes_done(std::size_t(s.ranks), 0);
    std::vector<int> todo; // parts to try to issue
    auto after_pass = [&](int rank, int after) { // the parts issued after pass `after` of `rank` (-1: before the first)
        const std::size_t slot = std::size_t(first_pass[std::size_t(rank)] + rank + after + 1);
        for (int i = parts_after_begin[slot]; i < parts_after_end[slot]; ++i) todo.push_back(i);
    };
    auto run_passes = [&](int rank) {
        const int n = int(programs[std::size_t(rank)].compute.size());
        int& done = passes_done[std::size_t(rank)];
        while (done < n && receiving[std::size_t(first_pass[std::size_t(rank)] + done)] == 0) after_pass(rank, done++);
    };
    auto complete = [&](replay_part& p) {
        p.complete = true;
        if (p.next_on_lane >= 0) todo.push_back(p.next_on_lane);
        for (int f : p.feeds)
            if (f >= 0 && --receiving[std::size_t(f)] == 0) run_passes(p.rank);
    };
    for (int r = 0; r < s.ranks; ++r) after_pass(r, -1), run_passes(r);
    while (!todo.empty()) {
        replay_part& p = parts[std::size_t(todo.back())];
        todo.pop_back();
        // Issued once the group before it on its stream is complete and the pass it follows has run.
        if (p.issued || (p.previous_on_lane >= 0 && !parts[std::size_t(p.previous_on_lane)].complete)) continue;
        if (p.after >= 0 && passes_done[std::size_t(p.rank)] <= p.after) continue;
        p.issued = true;
        for (int o = p.first_op; o < p.first_op + p.op_count; ++o) {
            replay_op& op = ops[std::size_t(o)];
            if (op.partner < 0) continue; // unmatched: the replay cannot finish, which the end names
            replay_op& partner = ops[std::size_t(op.partner)];
            replay_part& theirs = parts[std::size_t(partner.part)];
            if (!theirs.issued) continue;
            op.done = partner.done = true;
            ++p.ops_done;
            if (++theirs.ops_done == theirs.op_count) complete(theirs);
        }
        if (p.ops_done == p.op_count) complete(p);
    }

    bool finished = true;
    for (int r = 0; r < s.ranks; ++r) finished = finished && passes_done[std::size_t(r)] == int(programs[std::size_t(r)].compute.size());
    for (const replay_part& p : parts) finished = finished && p.complete;
    if (finished) return v;
    v.result = replay_verdict::outcome::deadlocks;
    // An issued group one of whose operations waits for a partner that is not issued: name both.
    for (const replay_part& mine : parts) {
        if (!mine.issued || mine.complete) continue;
        for (int o = mine.first_op; o < mine.first_op + mine.op_count; ++o) {
            const replay_op& op = ops[std::size_t(o)];
            if (op.done || op.partner < 0) continue;
            const replay_op& partner = ops[std::size_t(op.partner)];
            const replay_part& theirs = parts[std::size_t(partner.part)];
            v.waiting = op.op, v.held = partner.op, v.waiting_rank = mine.rank, v.held_rank = theirs.rank;
            v.waiting_before_first = mine.after < 0;
            if (mine.after >= 0) v.waiting_after = programs[std::size_t(mine.rank)].compute[std::size_t(mine.after)];
            const int at = passes_done[std::size_t(theirs.rank)];
            v.held_by_stream = theirs.after < at; // its own pass ran: a group before it on its stream holds it
            if (at < int(programs[std::size_t(theirs.rank)].compute.size())) v.held_at = programs[std::size_t(theirs.rank)].compute[std::size_t(at)];
            return v;
        }
    }
    return v;
}

//! `orders[r]` is rank r's passes (compute_order's, or any other order to be checked), its
//! sends and receives paired pass by pass or one by one (program_from_order).
constexpr replay_verdict check_replay(const schedule_shape& s, const std::vector<std::vector<compute_action>>& orders, communicator_layout layout,
                                      p2p_grouping grouping = p2p_grouping::paired) {
    if (int(orders.size()) != s.ranks)
        throw std::invalid_argument("capscope pipeline: check_replay was given " + std::to_string(orders.size()) + " ranks' orders for a schedule of " +
                                    std::to_string(s.ranks) + " ranks -- fix: one order per rank");
    std::vector<rank_program> programs;
    for (int r = 0; r < s.ranks; ++r) programs.push_back(program_from_order(s, r, orders[std::size_t(r)], grouping));
    return check_replay(s, programs, layout);
}

//! The shape's own programs (its grouping) with `microbatches` microbatches.
constexpr replay_verdict check_replay(const schedule_shape& s, int microbatches, communicator_layout layout,
                                      send_buffers buffers = send_buffers::own) {
    return check_replay(s, programs_of(s, microbatches), layout, buffers);
}

//! The shape's programs on `layout` as pipeline_p2p issues them: per edge, a pass that computes
//! a send waits for the edge's previous send (its buffer may be the same), which can close a
//! cycle the plain check does not see. The verdict every check of a schedule gives.
constexpr replay_verdict check_as_issued(const schedule_shape& s, int microbatches, communicator_layout layout) {
    return check_replay(s, microbatches, layout, send_buffers::one_per_edge);
}

//! The communicators a shape's sends and receives use with `microbatches` microbatches: the
//! shape's choice, or under `automatic` one shared communicator where replay completes on it
//! and one per directed edge otherwise. The verdict is the chosen layout's, as issued
//! (check_as_issued): per edge, a shape that would hang on the send-buffer waits is refused.
struct communicator_plan {
    communicator_layout layout = communicator_layout::shared;
    replay_verdict verdict{};
};
constexpr communicator_plan choose_communicators(const schedule_shape& s, int microbatches) {
    if (s.communicators != communicator_choice::automatic) {
        const communicator_layout l = s.communicators == communicator_choice::shared ? communicator_layout::shared : communicator_layout::per_edge;
        return {l, check_as_issued(s, microbatches, l)};
    }
    if (replay_verdict v = check_as_issued(s, microbatches, communicator_layout::shared); v.completes()) return {communicator_layout::shared, v};
    return {communicator_layout::per_edge, check_as_issued(s, microbatches, communicator_layout::per_edge)};
}

//! The verdict in words, for plan errors and reports.
inline std::string describe(const replay_verdict& v) {
    switch (v.result) {
    case replay_verdict::outcome::completes: return "every send and receive completes";
    case replay_verdict::outcome::crosses:
        return "rank " + std::to_string(v.held_rank) + "'s communicator with rank " + std::to_string(v.waiting_rank) + " matches the send of " +
               describe(v.waiting.m) + " with the receive of " + describe(v.held.m) + ", which would take its data silently";
    case replay_verdict::outcome::unmatched:
        return "rank " + std::to_string(v.waiting_rank) + (v.waiting.send ? " sends " : " receives ") + describe(v.waiting.m) + ", and rank " +
               std::to_string(v.held_rank) + "'s program has no matching " + (v.waiting.send ? "receive" : "send") + ": it would never complete";
    case replay_verdict::outcome::late:
        return "rank " + std::to_string(v.waiting_rank) + " receives " + describe(v.waiting.m) +
               (v.waiting_before_first ? " before its first pass" : " after its " + describe(v.waiting_after)) +
               ", and no later pass of it needs that: the pass that does ran before the data arrived, or it has none";
    case replay_verdict::outcome::early:
        return "rank " + std::to_string(v.waiting_rank) + " sends " + describe(v.waiting.m) +
               (v.waiting_before_first ? " before its first pass" : " after its " + describe(v.waiting_after)) +
               ", before the pass that computes it: it would send what is not there yet";
    case replay_verdict::outcome::missing:
        return "rank " + std::to_string(v.waiting_rank) + "'s " + describe(v.held_at) +
               " needs an input from another stage, and no receive of its program brings it: it would read a buffer nothing wrote";
    case replay_verdict::outcome::deadlocks: break;
    }
    const char* verb = v.waiting.send ? "sends " : "receives ";
    std::string text = "rank " + std::to_string(v.waiting_rank) + " " + verb + describe(v.waiting.m) +
                       (v.waiting_before_first ? " before its first pass" : " after its " + describe(v.waiting_after)) + ", and rank " +
                       std::to_string(v.held_rank) + " never issues the matching " + (v.held.send ? "send" : "receive") + ": ";
    text += v.held_by_stream ? "a group before it on that rank's stream never completes"
                             : "it is held before its " + describe(v.held_at) + ", waiting for what that pass receives";
    return text;
}

} // namespace capscope::pipeline
