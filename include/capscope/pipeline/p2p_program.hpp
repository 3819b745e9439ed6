#pragma once
//! @file
//! A rank's sends and receives around its passes, grouped as Megatron groups them: before each
//! pass, one group holds the previous pass's sends and this pass's receives (`send_forward_
//! recv_backward` and the like), so two neighbours that send to each other at once meet in one
//! group instead of each waiting for the other's receive.

#include <capscope/pipeline/compute_order.hpp>

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

//! One NCCL group of a rank: issued after its pass `after` (-1: before the first pass).
struct p2p_group {
    int after = -1;
    std::vector<p2p_op> ops;
};

struct rank_program {
    int rank = 0;
    std::vector<compute_action> compute;
    std::vector<p2p_group> groups; //!< in issue order; none empty
};

namespace detail {

//! A pass receives at most one message and sends at most one: a group holds at most two.
struct group_ops {
    p2p_op ops[2]{};
    int count = 0;
    constexpr void push_back(const p2p_op& o) { ops[count++] = o; }
    constexpr const p2p_op* begin() const { return ops; }
    constexpr const p2p_op* end() const { return ops + count; }
};

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

//! Rank `rank`'s passes and its groups of sends and receives.
constexpr rank_program program_of(const schedule_shape& s, int rank, int microbatches) {
    rank_program p{rank, compute_order(s, rank, microbatches), {}};
    for (int k = 0; k <= int(p.compute.size()); ++k) {
        p2p_group g{k - 1, {}};
        if (k > 0) detail::add_sends(s, rank, p.compute[std::size_t(k - 1)], g.ops);
        if (k < int(p.compute.size())) detail::add_receives(s, rank, p.compute[std::size_t(k)], g.ops);
        if (!g.ops.empty()) p.groups.push_back(std::move(g));
    }
    return p;
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
