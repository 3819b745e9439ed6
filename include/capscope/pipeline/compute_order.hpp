#pragma once
//! @file
//! The order in which one rank runs its forwards and backwards: Megatron's schedules (and GPipe)
//! derived from the shape, the rank and the microbatch count. Constant expressions allowed.

#include <capscope/pipeline/schedule_shape.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::pipeline {

enum class pass { forward, backward };

//! One unit of a rank's work: a pass of one chunk over one microbatch.
struct compute_action {
    pass direction = pass::forward;
    int chunk = 0;
    int microbatch = 0;
    friend constexpr bool operator==(const compute_action&, const compute_action&) = default;
};

namespace detail {

//! Interleaved: the k-th forward of every rank is (chunk, microbatch) of this table, groups of
//! `group` microbatches through every chunk in turn; the k-th backward runs the same microbatch
//! through the chunks in reverse (Megatron's schedule table).
constexpr compute_action interleaved_forward(const schedule_shape& s, int microbatches, int k) {
    const int g = s.group_size(), full = microbatches / g;
    const int group = std::min(k / (g * s.virtual_stages), full); // the last group may be short
    const int start = group * g, size = std::min(g, microbatches - start);
    const int in_group = k - start * s.virtual_stages;
    return {pass::forward, in_group / size, start + in_group % size};
}

} // namespace detail

//! How many forwards rank `rank` runs before its first backward.
constexpr int warmup_forwards(const schedule_shape& s, int rank, int microbatches) {
    switch (s.kind) {
    case schedule_kind::gpipe: return microbatches;
    case schedule_kind::one_f_one_b: return std::min(s.ranks - rank - 1, microbatches);
    case schedule_kind::interleaved_1f1b:
        return std::min((s.ranks - rank - 1) * 2 + (s.virtual_stages - 1) * s.group_size(), microbatches * s.virtual_stages);
    }
    return 0;
}

//! Rank `rank`'s passes in the order it runs them: warmup forwards, then one forward and one
//! backward in turn, then the remaining backwards. Every (chunk, microbatch) once each way.
constexpr std::vector<compute_action> compute_order(const schedule_shape& s, int rank, int microbatches) {
    if (rank < 0 || rank >= s.ranks || microbatches < 0)
        throw std::invalid_argument("capscope pipeline: rank " + std::to_string(rank) + " of a schedule of " + std::to_string(s.ranks) + " ranks, " +
                                    std::to_string(microbatches) + " microbatches -- fix: a rank in [0, ranks) and a count of at least 0");
    const int total = microbatches * s.virtual_stages;
    auto forward = [&](int k) {
        return s.kind == schedule_kind::interleaved_1f1b ? detail::interleaved_forward(s, microbatches, k) : compute_action{pass::forward, 0, k};
    };
    auto backward = [&](int k) {
        compute_action a = forward(k);
        return compute_action{pass::backward, s.virtual_stages - 1 - a.chunk, a.microbatch};
    };
    const int warmup = warmup_forwards(s, rank, microbatches);
    std::vector<compute_action> order;
    order.reserve(std::size_t(2 * total));
    for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
    for (int k = 0; k < total - warmup; ++k) order.push_back(forward(warmup + k)), order.push_back(backward(k));
    for (int k = total - warmup; k < total; ++k) order.push_back(backward(k));
    return order;
}

} // namespace capscope::pipeline
