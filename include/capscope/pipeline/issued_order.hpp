#pragma once
//! @file
//! The plan verifier's proof for a pipeline step (pure host): every two things of a rank's step
//! that touch one buffer, one of them writing, are ordered as `pipeline_p2p` issues them. The
//! happens-before relation comes from the issue alone: on one communicator, one stream in issue
//! order; per edge, the step's stream in pass order, each edge's stream in its parts' order, a
//! part after the pass before it (the fork), a pass after the parts holding its receives and after
//! every earlier send from a buffer it writes (matched by address, as the issuer matches), and the
//! step's end after every edge. Operations of one NCCL group run at once, so no two of them may
//! share bytes.
//!
//! What a pass touches follows the contract of capscope/parallel/pipeline_p2p.hpp: a forward
//! reads the activation received for it, a backward reads that activation again (recomputed or
//! kept) and the gradient received for it, and each pass writes the buffers of the sends it
//! computes. `buffer_of(op)` names every buffer, so a slot plan and the buffers a model hands the
//! issuer are checked together: a slot reused while its last reader may still run, a receive
//! whose pass does not wait for it, or a send buffer rewritten while it is sent, is found here
//! instead of as wrong numbers.

#include <capscope/pipeline/edge_plan.hpp>
#include <capscope/pipeline/p2p_buffer.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace capscope::pipeline {

namespace detail {

//! One thing the step issues: a pass on the step's stream, or a group (one communicator) or a
//! part of one (per edge) on its stream.
struct issued_node {
    int pass = -1;   //!< a pass: its index in the compute order
    int group = -1;  //!< or a group of the program (one communicator)
    int part = -1;   //!< or a part of the edge plan (per edge)
    std::vector<int> after; //!< the nodes it waits for directly (all issued before it)
};

struct touch {
    int node = 0;
    bool write = false;
    const char* data = nullptr;
    std::size_t bytes = 0;
    std::string what;
    p2p_op op;          //!< the send or receive whose bytes these are
    bool by_op = false; //!< the send or receive itself (else a pass: it writes a send's bytes, reads a receive's)
};

} // namespace detail

//! Rank `program.rank`'s step as issued on `layout` (shared: on one stream; per_edge: as `edges`
//! says, `plan_edges` for that rank) with the buffers `buffer_of(op)` gives (a p2p_buffer for
//! any p2p_op of the rank, including the receive of a pass whose input nothing sends it): the
//! first two touches of one buffer that the issue leaves unordered, said in words, or nothing.
template <class BufferOf>
std::optional<std::string> check_issued_order(const schedule_shape& s, const rank_program& program, communicator_layout layout,
                                              const edge_plan* edges, BufferOf&& buffer_of) {
    using detail::issued_node;
    if (layout == communicator_layout::per_direction)
        throw std::invalid_argument("capscope pipeline: check_issued_order: the issuer runs on one communicator or one per edge");
    if (layout == communicator_layout::per_edge && !edges)
        throw std::invalid_argument("capscope pipeline: check_issued_order: per edge, the rank's edge plan is needed (plan_edges)");
    const int rank = program.rank, n = int(program.compute.size()), last_stage = s.stages() - 1;
    std::vector<issued_node> nodes;
    // The nodes in issue order, with their direct waits.
    if (layout == communicator_layout::shared) {
        std::size_t next = 0;
        for (int k = 0; k <= n; ++k) {
            for (; next < program.groups.size() && program.groups[next].after == k - 1; ++next) {
                issued_node g{-1, int(next), -1, {}};
                if (!nodes.empty()) g.after.push_back(int(nodes.size()) - 1);
                nodes.push_back(std::move(g));
            }
            if (k == n) break;
            issued_node p{k, -1, -1, {}};
            if (!nodes.empty()) p.after.push_back(int(nodes.size()) - 1);
            nodes.push_back(std::move(p));
        }
    } else {
        std::vector<int> node_of_part(edges->parts.size(), -1), last_on_lane(std::size_t(detail::lane_count(s, layout)), -1);
        struct sent {
            const void* buffer;
            int node;
        };
        std::vector<sent> sends; // issued so far
        std::size_t next = 0;
        int last_pass = -1;
        for (int k = 0; k <= n; ++k) {
            for (; next < edges->parts.size() && edges->parts[next].after == k - 1; ++next) {
                const edge_part& pt = edges->parts[next];
                issued_node part{-1, -1, int(next), {}};
                if (last_pass >= 0) part.after.push_back(last_pass); // the fork
                if (int& prev = last_on_lane[std::size_t(pt.lane)]; prev >= 0) part.after.push_back(prev);
                node_of_part[next] = last_on_lane[std::size_t(pt.lane)] = int(nodes.size());
                for (const p2p_op& op : pt.ops)
                    if (op.send) sends.push_back({buffer_of(op).data, int(nodes.size())});
                nodes.push_back(std::move(part));
            }
            if (k == n) break;
            issued_node p{k, -1, -1, {}};
            if (last_pass >= 0) p.after.push_back(last_pass);
            for (int pt : edges->receives_for[std::size_t(k)]) {
                if (node_of_part[std::size_t(pt)] < 0)
                    return "capscope pipeline: rank " + std::to_string(rank) + "'s plan issues the sends and receives of edge lane " +
                           std::to_string(edges->parts[std::size_t(pt)].lane) + " after pass " + std::to_string(edges->parts[std::size_t(pt)].after) +
                           ", after the " + describe(program.compute[std::size_t(k)]) + " that reads what they receive -- fix: issue a "
                           "receive before the pass that reads it (pipeline::plan_edges)";
                p.after.push_back(node_of_part[std::size_t(pt)]);
            }
            for (const part_send& w : edges->sends_of[std::size_t(k)]) {
                const void* at = buffer_of(edges->parts[std::size_t(w.part)].ops[w.op]).data;
                for (const sent& earlier : sends)
                    if (earlier.buffer == at) p.after.push_back(earlier.node);
            }
            last_pass = int(nodes.size());
            nodes.push_back(std::move(p));
        }
        issued_node end; // the step's end: its stream, joined by every edge
        if (last_pass >= 0) end.after.push_back(last_pass);
        for (int l : last_on_lane)
            if (l >= 0) end.after.push_back(l);
        nodes.push_back(std::move(end));
    }
    // What happens before each node: nodes are in issue order, and every wait points back.
    const std::size_t count = nodes.size(), words = (count + 63) / 64;
    std::vector<std::uint64_t> before(count * words, 0);
    auto bit = [&](std::size_t node, std::size_t other) { return (before[node * words + other / 64] >> (other % 64)) & 1u; };
    for (std::size_t i = 0; i < count; ++i)
        for (int p : nodes[i].after) {
            for (std::size_t w = 0; w < words; ++w) before[i * words + w] |= before[std::size_t(p) * words + w];
            before[i * words + std::size_t(p) / 64] |= std::uint64_t{1} << (std::size_t(p) % 64);
        }
    // Every touch of a buffer.
    std::vector<detail::touch> touches;
    auto add = [&](int node, bool write, const p2p_op& op, std::string what) {
        const p2p_buffer b = buffer_of(op);
        touches.push_back({node, write, static_cast<const char*>(b.data), b.bytes, std::move(what), op, nodes[std::size_t(node)].pass < 0});
    };
    auto op_words = [](const p2p_op& op) { return std::string(op.send ? "the send of " : "the receive of ") + describe(op.m); };
    for (std::size_t i = 0; i < count; ++i) {
        const issued_node& nd = nodes[i];
        if (nd.group >= 0)
            for (const p2p_op& op : program.groups[std::size_t(nd.group)].ops) add(int(i), !op.send, op, op_words(op));
        if (nd.part >= 0)
            for (const p2p_op& op : edges->parts[std::size_t(nd.part)].ops) add(int(i), !op.send, op, op_words(op));
        if (nd.pass < 0) continue;
        const compute_action& a = program.compute[std::size_t(nd.pass)];
        const int vs = s.stage_of(rank, a.chunk);
        const std::string who = "the " + describe(a);
        p2p_op op;
        if (vs > 0 && detail::receive_for(s, rank, {pass::forward, a.chunk, a.microbatch}, op)) add(int(i), false, op, who + " (its input)");
        if (a.direction == pass::backward && vs < last_stage && detail::receive_for(s, rank, a, op))
            add(int(i), false, op, who + " (the gradient it received)");
        if (detail::send_of(s, rank, a, op)) add(int(i), true, op, who + " (what it sends)");
    }
    auto happens_before = [&](int a, int b) { return a != b && bit(std::size_t(b), std::size_t(a)); };
    const auto key = [](const detail::touch& t) {
        return std::tuple(t.by_op, t.op.send, t.op.m.from, t.op.m.to, int(t.op.m.what), t.op.m.stage, t.op.m.microbatch);
    };
    const std::string at_rank = "capscope pipeline: rank " + std::to_string(rank) + "'s step as issued ";
    // Each send and receive once, and each write found by what it writes: a send's bytes by the
    // pass that computes it, a receive's by the receive.
    std::map<decltype(key(touches[0])), std::size_t> writer_of, operation;
    for (std::size_t t = 0; t < touches.size(); ++t) {
        if (touches[t].by_op && !operation.emplace(key(touches[t]), t).second)
            return at_rank + "holds " + touches[t].what + " twice -- fix: each send and receive once in a step";
        if (touches[t].write) writer_of.emplace(key(touches[t]), t);
    }
    const auto unordered = [&](std::size_t x, std::size_t y) {
        const detail::touch &a = touches[x], &b = touches[y];
        if (a.node == b.node) return nodes[std::size_t(a.node)].pass < 0; // one group runs its operations at once; one pass, in its own order
        return !happens_before(a.node, b.node) && !happens_before(b.node, a.node);
    };
    const auto race = [&](std::size_t x, std::size_t y) {
        const detail::touch &a = touches[std::min(x, y)], &b = touches[std::max(x, y)];
        const bool same_node = a.node == b.node;
        return at_rank + "lets " + a.what + " and " + b.what + " touch the same bytes " + (same_node ? "at once, in one NCCL group" : "in either order") +
               " (" + (a.write && b.write ? "both write" : a.write ? "the first writes" : "the second writes") + ") -- fix: " +
               (same_node ? "a buffer of its own for each send and receive of a group"
                          : "a slot of its own for every microbatch in flight (pipeline::plan_slots), a send buffer written only by the "
                            "pass that computes that send, and the issuer's waits (pipeline_p2p::run)");
    };
    // Each buffer's touches in issue order (a node waits only for earlier ones, so issue order
    // extends happens-before). Like a race detector: a write must come after the last write and
    // every read since, a read after the last write, which must be the read's own writer (a pass
    // reads its receive's bytes, a send its pass's). Then every two touches of the buffer, one
    // writing, are ordered, and each read reads what its writer wrote.
    std::map<std::pair<const char*, std::size_t>, std::vector<std::size_t>> by_range;
    for (std::size_t t = 0; t < touches.size(); ++t)
        if (touches[t].bytes != 0) by_range[{touches[t].data, touches[t].bytes}].push_back(t);
    for (const auto& [range, list] : by_range) {
        std::optional<std::size_t> last_write;
        std::vector<std::size_t> reads_since;
        for (std::size_t t : list) {
            const detail::touch& cur = touches[t];
            if (cur.write) {
                if (last_write && unordered(*last_write, t)) return race(*last_write, t);
                for (std::size_t r : reads_since)
                    if (unordered(r, t)) return race(r, t);
                last_write = t;
                reads_since.clear();
                continue;
            }
            detail::touch wanted = cur;
            wanted.by_op = !cur.by_op;
            const auto found = writer_of.find(key(wanted));
            if (found == writer_of.end())
                return at_rank + "has nothing that writes what " + cur.what + " reads -- fix: " +
                       (cur.by_op ? "a send for a pass this rank runs" : "the receive of every pass's input in the step");
            const detail::touch& writer = touches[found->second];
            if (!happens_before(writer.node, cur.node))
                return at_rank + "lets " + cur.what + " run before " + writer.what + " has finished -- fix: the issuer's waits for the receives "
                       "a pass reads (pipeline_p2p::run)";
            if (last_write && unordered(*last_write, t)) return race(*last_write, t);
            if (last_write != found->second)
                return at_rank + "lets " + (last_write ? touches[*last_write].what : std::string("another write")) + " overwrite the bytes that " +
                       writer.what + " wrote before " + cur.what + " reads them -- fix: a slot of its own for every microbatch in flight "
                       "(pipeline::plan_slots), and a send buffer written only by the pass that computes that send";
            reads_since.push_back(t);
        }
    }
    // Buffers that overlap without being the same (rare: a model's slots and send buffers are
    // apart): every two touches across them, one writing, ordered, and no write of one between a
    // read of the other and that read's writer.
    const auto clobbers = [&](std::size_t write, std::size_t read) -> std::optional<std::string> {
        detail::touch wanted = touches[read];
        wanted.by_op = !wanted.by_op;
        const auto found = writer_of.find(key(wanted));
        if (found == writer_of.end() || !happens_before(touches[found->second].node, touches[write].node) ||
            !happens_before(touches[write].node, touches[read].node))
            return std::nullopt;
        return at_rank + "lets " + touches[write].what + " overwrite bytes that " + touches[found->second].what + " wrote before " +
               touches[read].what + " reads them (two buffers that overlap) -- fix: buffers apart for every slot and send";
    };
    for (auto a = by_range.begin(); a != by_range.end(); ++a)
        for (auto b = std::next(a); b != by_range.end() && b->first.first < a->first.first + a->first.second; ++b)
            for (std::size_t x : a->second)
                for (std::size_t y : b->second) {
                    if (!touches[x].write && !touches[y].write) continue;
                    if (unordered(x, y)) return race(x, y);
                    if (touches[x].write && !touches[y].write)
                        if (auto c = clobbers(x, y)) return c;
                    if (touches[y].write && !touches[x].write)
                        if (auto c = clobbers(y, x)) return c;
                }
    return std::nullopt;
}

} // namespace capscope::pipeline
