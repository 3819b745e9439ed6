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

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
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

inline std::string node_words(const rank_program& program, const edge_plan* edges, const issued_node& n) {
    if (n.pass >= 0) return "the " + describe(program.compute[std::size_t(n.pass)]);
    if (n.group >= 0) return "the group of sends and receives after pass " + std::to_string(program.groups[std::size_t(n.group)].after);
    return "the sends and receives on edge lane " + std::to_string(edges->parts[std::size_t(n.part)].lane) + " after pass " +
           std::to_string(edges->parts[std::size_t(n.part)].after);
}

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
    std::vector<int> node_of_pass(std::size_t(n), -1);
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
            node_of_pass[std::size_t(k)] = int(nodes.size());
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
            for (int pt : edges->receives_for[std::size_t(k)]) p.after.push_back(node_of_part[std::size_t(pt)]);
            for (const part_send& w : edges->sends_of[std::size_t(k)]) {
                const void* at = buffer_of(edges->parts[std::size_t(w.part)].ops[w.op]).data;
                for (const sent& earlier : sends)
                    if (earlier.buffer == at) p.after.push_back(earlier.node);
            }
            node_of_pass[std::size_t(k)] = last_pass = int(nodes.size());
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
    // Per edge, the step's end must come after everything.
    if (layout == communicator_layout::per_edge)
        for (std::size_t i = 0; i + 1 < count; ++i)
            if (!bit(count - 1, i))
                return "capscope pipeline: rank " + std::to_string(rank) + "'s step can return before " +
                       detail::node_words(program, edges, nodes[i]) + " has finished -- fix: join every edge's stream into the step's";
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
    auto overlap = [](const detail::touch& a, const detail::touch& b) {
        return a.bytes != 0 && b.bytes != 0 && a.data < b.data + b.bytes && b.data < a.data + a.bytes;
    };
    // Each read reads what its writer wrote: a pass reads its receive's bytes, a send its pass's.
    // The writer comes first, and no other write of those bytes comes between them.
    for (const detail::touch& reader : touches) {
        if (reader.write) continue;
        const detail::touch* writer = nullptr;
        for (const detail::touch& t : touches)
            if (t.write && t.op == reader.op && t.by_op != reader.by_op) writer = &t;
        if (!writer) continue; // a pass's input that no operation of this step carries
        if (!happens_before(writer->node, reader.node))
            return "capscope pipeline: rank " + std::to_string(rank) + "'s step as issued lets " + reader.what + " run before " + writer->what +
                   " has finished -- fix: the issuer's waits for the receives a pass reads (pipeline_p2p::run)";
        for (const detail::touch& other : touches)
            if (&other != writer && other.write && overlap(other, reader) && happens_before(writer->node, other.node) &&
                happens_before(other.node, reader.node))
                return "capscope pipeline: rank " + std::to_string(rank) + "'s step as issued lets " + other.what + " overwrite the bytes that " +
                       writer->what + " wrote before " + reader.what + " reads them -- fix: a slot of its own for every microbatch in flight "
                       "(pipeline::plan_slots), and a send buffer written only by the pass that computes that send";
    }
    // Any two touches of the same bytes, one writing, are ordered.
    for (std::size_t x = 0; x < touches.size(); ++x)
        for (std::size_t y = x + 1; y < touches.size(); ++y) {
            const detail::touch &a = touches[x], &b = touches[y];
            if (!a.write && !b.write) continue;
            if (!overlap(a, b)) continue;
            const bool same_node = a.node == b.node;
            if (same_node && nodes[std::size_t(a.node)].pass >= 0) continue; // one pass, in its own order
            if (!same_node && bit(std::size_t(std::max(a.node, b.node)), std::size_t(std::min(a.node, b.node)))) continue;
            return "capscope pipeline: rank " + std::to_string(rank) + "'s step as issued lets " + a.what + " and " + b.what + " touch the same bytes " +
                   (same_node ? "at once, in one NCCL group" : "in either order") + " (" +
                   (a.write && b.write ? "both write" : a.write ? "the first writes" : "the second writes") + ") -- fix: " +
                   (same_node ? "a buffer of its own for each send and receive of a group"
                              : "a slot of its own for every microbatch in flight (pipeline::plan_slots), a send buffer written only by the "
                                "pass that computes that send, and the issuer's waits (pipeline_p2p::run)");
        }
    return std::nullopt;
}

} // namespace capscope::pipeline
