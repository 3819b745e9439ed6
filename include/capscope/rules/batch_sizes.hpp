#pragma once
//! @file
//! The batch sizes Megatron-LM captures inference graphs for, derived as Megatron derives them
//! (`CUDAGraphBatchDimensionBuilder._calculate_cuda_graph_token_counts`, commit d98e8a64dd):
//! from `--inference-dynamic-batching-num-cuda-graphs` (N, or -1 for automatic),
//! `--inference-cuda-graph-max-tokens`, `--tensor-model-parallel-size` and
//! `--inference-dynamic-batching-cuda-graph-sizing-distribution`. A decode step runs one token
//! per request, so these token counts are the batch sizes of decode graphs.
//!
//! Megatron first clamps the max tokens to at least `max_requests * (num_speculative_tokens + 1)`
//! and at most the context's `max_tokens`; pass the clamped value here, or derive everything from
//! a command line with `megatron_inference_graphs` (rules/inference_graphs.hpp), which models the
//! clamps and the batch dimensions. Batch-invariant mode (64-token rounding) is not modelled.

#include <capscope/vocabulary/buckets.hpp>

#include <algorithm>
#include <vector>

namespace capscope {

enum class bucket_sizing : unsigned char { exponential, linear };

namespace detail {
constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
constexpr long long round_up_to(long long v, long long m) { return ceil_div(v, m) * m; }
constexpr int floor_log2(long long v) {
    int r = 0;
    while (v > 1) {
        v >>= 1;
        ++r;
    }
    return r;
}

//! Ascending, unique insert into a small sorted array.
struct size_set {
    std::array<long long, 2 * bucket_list::capacity> v{};
    int n = 0;
    constexpr void add(long long x) {
        int i = 0;
        while (i < n && v[std::size_t(i)] < x) ++i;
        if (i < n && v[std::size_t(i)] == x) return;
        if (n == int(v.size())) throw std::length_error("capscope: too many bucket sizes");
        for (int j = n; j > i; --j) v[std::size_t(j)] = v[std::size_t(j - 1)];
        v[std::size_t(i)] = x;
        ++n;
    }
};

constexpr bucket_list to_bucket_list(const size_set& s) {
    bucket_list out;
    for (int i = 0; i < s.n; ++i) out.push_back(int(s.v[std::size_t(i)]));
    return out;
}
} // namespace detail

namespace detail {
//! A growing sorted set with size_set's interface, for lists past bucket_list's capacity.
struct growing_size_set {
    std::vector<long long> v;
    int n = 0;
    void add(long long x) {
        v.resize(std::size_t(n));
        const auto it = std::lower_bound(v.begin(), v.end(), x);
        if (it != v.end() && *it == x) return;
        v.insert(it, x);
        ++n;
    }
};

//! The derivation, into any sorted set with `add(x)`, `v` and `n`.
template <class Set>
constexpr Set megatron_token_count_set(int num_cuda_graphs, int max_tokens, int tp_size, bucket_sizing sizing) {
    if (tp_size < 1) throw std::invalid_argument("capscope: tensor_model_parallel_size must be >= 1");
    if (max_tokens < 1) throw std::invalid_argument("capscope: inference_cuda_graph_max_tokens must be > 0");
    if (num_cuda_graphs < 1 && num_cuda_graphs != -1)
        throw std::invalid_argument("capscope: inference_dynamic_batching_num_cuda_graphs must be >= 1 or -1");
    constexpr long long rounder = 2; // CUDA_GRAPH_ROUNDER
    const long long tp = tp_size;
    Set sizes;

    if (sizing == bucket_sizing::linear) {
        if (num_cuda_graphs == -1) {
            // [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), TP-aligned, at most max, plus max.
            auto add = [&](long long s) {
                const long long a = round_up_to(s, tp);
                if (a <= max_tokens) sizes.add(a);
            };
            for (long long s : {1LL, 2LL, 4LL}) add(s);
            for (long long s = 8; s < 256; s += 8) add(s);
            for (long long s = 256; s <= max_tokens; s += 16) add(s);
            sizes.add(max_tokens);
            return sizes;
        }
        long long step = max_tokens / num_cuda_graphs; // int(max / N)
        step = rounder * ceil_div(step, rounder);
        step = std::max(round_up_to(step, tp), tp);
        const long long top = (max_tokens / tp) * tp;
        if (num_cuda_graphs == 1) {
            sizes.add(top);
            return sizes;
        }
        for (long long s = step; s < top; s += step) sizes.add(s);
        sizes.add(top);
        return sizes;
    }

    if (num_cuda_graphs == -1) // log2(max) halvings plus the two forced endpoints, at least 4
        return megatron_token_count_set<Set>(std::max(4, floor_log2(std::max(2, max_tokens)) + 2), max_tokens, tp_size, sizing);
    const long long top = (max_tokens / tp) * tp;
    if (num_cuda_graphs == 1) {
        sizes.add(top);
        return sizes;
    }
    long long val = top;
    for (int i = 0; i < num_cuda_graphs; ++i) {
        const long long rounded = std::max(rounder, (val / rounder) * rounder);
        sizes.add(ceil_div(rounded, tp) * tp);
        val /= 2;
        if (val < 1) break;
    }
    sizes.add(top);
    sizes.add(tp);
    // Megatron trims from the middle of its descending list (the second-smallest first) until
    // at most N remain.
    while (sizes.n > num_cuda_graphs) {
        for (int j = 1; j + 1 < sizes.n; ++j) sizes.v[std::size_t(j)] = sizes.v[std::size_t(j + 1)];
        --sizes.n;
    }
    return sizes;
}
} // namespace detail

//! Megatron's graph token counts, ascending. Throws `std::invalid_argument` where Megatron's
//! assertions fail (num_cuda_graphs < 1 other than -1, max_tokens < 1, tp_size < 1).
constexpr bucket_list megatron_cuda_graph_batch_sizes(int num_cuda_graphs, int max_tokens, int tp_size = 1,
                                                      bucket_sizing sizing = bucket_sizing::exponential) {
    return detail::to_bucket_list(detail::megatron_token_count_set<detail::size_set>(num_cuda_graphs, max_tokens, tp_size, sizing));
}

//! The same, as a vector of any length (automatic linear sizing of a large budget has hundreds).
inline std::vector<int> megatron_cuda_graph_token_counts(int num_cuda_graphs, int max_tokens, int tp_size = 1,
                                                         bucket_sizing sizing = bucket_sizing::exponential) {
    const auto s = detail::megatron_token_count_set<detail::growing_size_set>(num_cuda_graphs, max_tokens, tp_size, sizing);
    return {s.v.begin(), s.v.begin() + s.n};
}

} // namespace capscope
