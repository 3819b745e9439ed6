#pragma once
//! @file
//! A rank's sends and receives around its passes, in groups issued after the pass they follow:
//! as Megatron-LM's schedules.py issues them without p2p overlap (the default), paired pass by
//! pass, or one by one (`p2p_grouping`, schedule_shape.hpp). Two neighbours that send to each
//! other at once meet in one group instead of each waiting for the other's receive.

#include <capscope/pipeline/compute_order.hpp>

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::pipeline {

enum class carries { activation, gradient };

//! What travels: the output of one virtual stage's pass, to the stage that consumes it.
struct message {
    int from = 0, to = 0; //!< ranks
    carries what = carries::activation;
    int stage = 0;        //!< the virtual stage that receives it
    int microbatch = 0;
    friend constexpr bool operator==(const message&, const message&) = default;
};

struct p2p_op {
    bool send = false; //!< else a receive
    message m;
    friend constexpr bool operator==(const p2p_op&, const p2p_op&) = default;
};

//! A group's operations: at most four (Megatron's steady state sends an activation and a
//! gradient and receives one of each), kept in place, so that a constant expression that builds
//! thousands of groups allocates nothing for them.
class group_ops {
public:
    static constexpr std::size_t capacity = 4;
    constexpr group_ops() = default;
    constexpr group_ops(std::initializer_list<p2p_op> ops) {
        for (const p2p_op& o : ops) push_back(o);
    }
    constexpr void push_back(const p2p_op& o) {
        if (count_ == capacity) throw std::length_error("capscope pipeline: a group holds at most four sends and receives");
        ops_[count_++] = o;
    }
    constexpr std::size_t size() const { return count_; }
    constexpr bool empty() const { return count_ == 0; }
    constexpr const p2p_op& operator[](std::size_t i) const { return ops_[i]; }
    constexpr const p2p_op* begin() const { return ops_; }
    constexpr const p2p_op* end() const { return ops_ + count_; }

private:
    p2p_op ops_[capacity]{};
    std::size_t count_ = 0;
};

//! One NCCL group of a rank: issued after its pass `after` (-1: before the first).
struct p2p_group {
    int after = -1;
    group_ops ops;
};

struct rank_program {
    int rank = 0;
    std::vector<compute_action> compute;
    std::vector<p2p_group> groups; //!< in issue order; none empty
};

namespace detail {

template <class Out>
constexpr void add_receives(const schedule_shape& s, int rank, const compute_action& a, Out& out) {
    const int vs = s.stage_of(rank, a.chunk), last = s.stages() - 1;
    if (a.direction == pass::forward && vs > 0)
        out.push_back({false, {s.rank_of(vs - 1), rank, carries::activation, vs, a.microbatch}});
    if (a.direction == pass::backward && vs < last)
        out.push_back({false, {s.rank_of(vs + 1), rank, carries::gradient, vs, a.microbatch}});
}
template <class Out>
constexpr void add_sends(const schedule_shape& s, int rank, const compute_action& a, Out& out) {
    const int vs = s.stage_of(rank, a.chunk), last = s.stages() - 1;
    if (a.direction == pass::forward && vs < last)
        out.push_back({true, {rank, s.rank_of(vs + 1), carries::activation, vs + 1, a.microbatch}});
    if (a.direction == pass::backward && vs > 0)
        out.push_back({true, {rank, s.rank_of(vs - 1), carries::gradient, vs - 1, a.microbatch}});
}

} // namespace detail


namespace detail {

//! The receive rank `rank` posts for pass `a` (its input from the neighbouring stage), if any.
constexpr bool receive_for(const schedule_shape& s, int rank, const compute_action& a, p2p_op& out) {
    group_ops g;
    add_receives(s, rank, a, g);
    if (!g.empty()) out = g[0];
    return !g.empty();
}
constexpr bool send_of(const schedule_shape& s, int rank, const compute_action& a, p2p_op& out) {
    group_ops g;
    add_sends(s, rank, a, g);
    if (!g.empty()) out = g[0];
    return !g.empty();
}

//! Megatron's 1F1B (forward_backward_pipelining_without_interleaving), its p2p calls in order.
constexpr rank_program megatron_one_f_one_b(const schedule_shape& s, int rank, int microbatches) {
    rank_program p{rank, compute_order(s, rank, microbatches), {}};
    const int w = warmup_forwards(s, rank, microbatches), rest = microbatches - w;
    auto group = [&](int after, std::initializer_list<const compute_action*> receives, std::initializer_list<const compute_action*> sends) {
        p2p_group g{after, {}};
        p2p_op op;
        for (const compute_action* a : sends)
            if (send_of(s, rank, *a, op)) g.ops.push_back(op);
        for (const compute_action* a : receives)
            if (receive_for(s, rank, *a, op)) g.ops.push_back(op);
        if (!g.ops.empty()) p.groups.push_back(std::move(g));
    };
    const std::vector<compute_action>& o = p.compute;
    int at = 0; // passes issued so far
    for (int i = 0; i < w; ++i) group(at - 1, {&o[std::size_t(at)]}, {}), ++at, group(at - 1, {}, {&o[std::size_t(at - 1)]});
    if (rest > 0) group(at - 1, {&o[std::size_t(at)]}, {});
    for (int i = 0; i < rest; ++i) {
        ++at; // the forward
        group(at - 1, {&o[std::size_t(at)]}, {&o[std::size_t(at - 1)]}); // send_forward_recv_backward
        ++at; // the backward
        if (i == rest - 1) group(at - 1, {}, {&o[std::size_t(at - 1)]});
        else group(at - 1, {&o[std::size_t(at)]}, {&o[std::size_t(at - 1)]}); // send_backward_recv_forward
    }
    for (int i = 0; i < w; ++i) group(at - 1, {&o[std::size_t(at)]}, {}), ++at, group(at - 1, {}, {&o[std::size_t(at - 1)]});
    return p;
}

//! Megatron's interleaved schedule (forward_backward_pipelining_with_interleaving, no overlap).
constexpr rank_program megatron_interleaved(const schedule_shape& s, int rank, int microbatches) {
    rank_program p{rank, compute_order(s, rank, microbatches), {}};
    const int P = s.ranks, V = s.virtual_stages, total = microbatches * V, last = s.stages() - 1;
    const int w = warmup_forwards(s, rank, microbatches), rest = total - w;
    auto forward = [&](int k) { return interleaved_forward(s, microbatches, k); };
    auto backward_chunk = [&](int k) { return V - 1 - forward(k).chunk; };
    auto send_forward = [&](int k, p2p_group& g) {
        const int st = forward(k).chunk * P + rank;
        if (st < last) g.ops.push_back({true, {rank, (rank + 1) % P, carries::activation, st + 1, forward(k).microbatch}});
    };
    auto send_backward = [&](int k, p2p_group& g) {
        const int st = backward_chunk(k) * P + rank;
        if (st > 0) g.ops.push_back({true, {rank, (rank - 1 + P) % P, carries::gradient, st - 1, forward(k).microbatch}});
    };
    // The activation received at step k: the next forward's input; on the first rank, what the
    // last rank sent ranks - 1 steps before (its output for the next chunk).
    auto receive_previous = [&](int k, p2p_group& g) {
        if (rank > 0) {
            if (k + 1 < total) g.ops.push_back({false, {rank - 1, rank, carries::activation, forward(k + 1).chunk * P + rank, forward(k + 1).microbatch}});
            return;
        }
        if (k < P - 1) return;
        const compute_action a = forward(k - (P - 1));
        if (a.chunk < V - 1) g.ops.push_back({false, {P - 1, 0, carries::activation, (a.chunk + 1) * P, a.microbatch}});
    };
    auto receive_next = [&](int k, p2p_group& g) {
        if (rank < P - 1) {
            if (k + 1 < total) g.ops.push_back({false, {rank + 1, rank, carries::gradient, backward_chunk(k + 1) * P + rank, forward(k + 1).microbatch}});
            return;
        }
        if (k < P - 1) return;
        const int c = backward_chunk(k - (P - 1));
        if (c > 0) g.ops.push_back({false, {0, P - 1, carries::gradient, (c - 1) * P + P - 1, forward(k - (P - 1)).microbatch}});
    };
    auto add = [&](p2p_group&& g) {
        if (!g.ops.empty()) p.groups.push_back(std::move(g));
    };
    int at = 0;
    if (rank > 0) add({-1, {{false, {rank - 1, rank, carries::activation, forward(0).chunk * P + rank, forward(0).microbatch}}}});
    for (int k = 0; k < w; ++k) {
        ++at;
        p2p_group g{at - 1, {}};
        send_forward(k, g);
        if (k != total - 1) receive_previous(k, g);
        if (k == w - 1 && w < total && rank < P - 1)
            g.ops.push_back({false, {rank + 1, rank, carries::gradient, backward_chunk(0) * P + rank, forward(0).microbatch}});
        add(std::move(g));
    }
    if (w == total && rank < P - 1) add({at - 1, {{false, {rank + 1, rank, carries::gradient, backward_chunk(0) * P + rank, forward(0).microbatch}}}});
    for (int k = 0; k < rest; ++k) {
        at += 2; // the forward w + k and the backward k
        p2p_group g{at - 1, {}};
        send_forward(w + k, g);
        send_backward(k, g);
        if (k != rest - 1) receive_previous(w + k, g);
        receive_next(k, g);
        add(std::move(g));
    }
    for (int k = rest; k < total; ++k) {
        ++at;
        p2p_group g{at - 1, {}};
        send_backward(k, g);
        if (k != total - 1) receive_next(k, g);
        add(std::move(g));
    }
    return p;
}

} // namespace detail

//! A rank's groups of sends and receives around `order` (any order of its passes), paired or
//! one by one.
constexpr rank_program program_from_order(const schedule_shape& s, int rank, std::vector<compute_action> order,
                                          p2p_grouping grouping = p2p_grouping::paired) {
    rank_program p{rank, std::move(order), {}};
    for (int k = 0; k <= int(p.compute.size()); ++k) {
        p2p_group g{k - 1, {}};
        if (k > 0) detail::add_sends(s, rank, p.compute[std::size_t(k - 1)], g.ops);
        if (k < int(p.compute.size())) detail::add_receives(s, rank, p.compute[std::size_t(k)], g.ops);
        if (g.ops.empty()) continue;
        if (grouping != p2p_grouping::one_by_one) {
            p.groups.push_back(std::move(g));
            continue;
        }
        for (const p2p_op& op : g.ops) p.groups.push_back({k - 1, {op}});
    }
    return p;
}

//! Rank `rank`'s passes and its groups of sends and receives, grouped as the shape says.
constexpr rank_program program_of(const schedule_shape& s, int rank, int microbatches) {
    if (s.grouping == p2p_grouping::megatron && s.kind == schedule_kind::one_f_one_b) return detail::megatron_one_f_one_b(s, rank, microbatches);
    if (s.grouping == p2p_grouping::megatron && s.kind == schedule_kind::interleaved_1f1b) return detail::megatron_interleaved(s, rank, microbatches);
    return program_from_order(s, rank, compute_order(s, rank, microbatches), s.grouping == p2p_grouping::one_by_one ? s.grouping : p2p_grouping::paired);
}

constexpr std::vector<rank_program> programs_of(const schedule_shape& s, int microbatches) {
    std::vector<rank_program> all;
    for (int r = 0; r < s.ranks; ++r) all.push_back(program_of(s, r, microbatches));
    return all;
}

//! "forward of chunk 1, microbatch 3"
inline std::string describe(const compute_action& a) {
    return std::string(a.direction == pass::forward ? "forward" : "backward") + " of chunk " + std::to_string(a.chunk) + ", microbatch " +
           std::to_string(a.microbatch);
}
//! "the activation of microbatch 3 for stage 5 (rank 0 to rank 1)"
inline std::string describe(const message& m) {
    return std::string("the ") + (m.what == carries::activation ? "activation" : "gradient") + " of microbatch " + std::to_string(m.microbatch) +
           " for stage " + std::to_string(m.stage) + " (rank " + std::to_string(m.from) + " to rank " + std::to_string(m.to) + ")";
}

} // namespace capscope::pipeline
