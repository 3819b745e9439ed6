#pragma once
//! @file
//! Inference-runner options (engine options: Megatron has no flag for most of them, and
//! `select` does not match on them).
//!
//! @code
//! config<impl::lazy_per_layer, inference::per_block, buckets<1, 2, 4, 8, 16>,
//!        oversize_requests<oversize::run_eagerly>>
//! config<impl::lazy_per_layer, inference::per_layer, megatron_buckets<16, 512>>  // Megatron's sizes
//! config<vision<impl::ahead_of_time_per_layer, max_seq_length<784>>, length_buckets<196, 400, 784>>
//! @endcode

#include <capscope/config/engine_options.hpp>
#include <capscope/rules/batch_sizes.hpp>

namespace capscope {

namespace detail {
template <int... Sizes>
constexpr bool ascending_positive() {
    int last = 0;
    return sizeof...(Sizes) > 0 && sizeof...(Sizes) <= bucket_list::capacity && ((Sizes > last ? (last = Sizes, true) : false) && ...);
}
} // namespace detail

//! The batch sizes an inference runner captures one graph each for, ascending.
template <int... Sizes>
struct buckets {
    static_assert(detail::ascending_positive<Sizes...>(),
                  "capscope plan rule P4: the bucket sizes are not positive and strictly increasing -- fix: list them ascending "
                  "without repeats, e.g. buckets<1, 2, 4, 8, 16>");
    using option_kind = option_kind::batch_buckets;
    static constexpr void apply(engine_settings& e) { e.batch_buckets = bucket_list{Sizes...}; }
};

//! The batch sizes Megatron-LM would capture decode graphs for (capscope/rules/batch_sizes.hpp):
//! `--inference-dynamic-batching-num-cuda-graphs NumGraphs --inference-cuda-graph-max-tokens
//! MaxTokens --tensor-model-parallel-size TpSize`.
template <int NumGraphs, int MaxTokens = 512, int TpSize = 1, bucket_sizing Sizing = bucket_sizing::exponential>
struct megatron_buckets {
    static_assert((NumGraphs >= 1 || NumGraphs == -1) && MaxTokens >= TpSize && TpSize >= 1,
                  "capscope plan rule P4: megatron_buckets<NumGraphs, MaxTokens, TpSize> needs NumGraphs >= 1 or -1 and "
                  "MaxTokens >= TpSize >= 1 -- fix: pass Megatron's --inference-dynamic-batching-num-cuda-graphs, "
                  "--inference-cuda-graph-max-tokens and --tensor-model-parallel-size");
    using option_kind = option_kind::batch_buckets;
    static constexpr bucket_list sizes = megatron_cuda_graph_batch_sizes(NumGraphs, MaxTokens, TpSize, Sizing);
    static constexpr void apply(engine_settings& e) { e.batch_buckets = sizes; }
};

//! The padded lengths of a variable-length encoder (vision patches), ascending: a batch runs in
//! the smallest >= its longest sample. Without it the encoder pads to vision `max_seq_length`.
template <int... Lengths>
struct length_buckets {
    static_assert(detail::ascending_positive<Lengths...>(),
                  "capscope plan rule P4: the length buckets are not positive and strictly increasing -- fix: list them ascending "
                  "without repeats, e.g. length_buckets<196, 400, 784>");
    using option_kind = option_kind::length_buckets;
    static constexpr void apply(engine_settings& e) { e.length_buckets = bucket_list{Lengths...}; }
};

//! What to do with a request past the largest bucket: raise (the default) or run it eagerly.
template <oversize O>
struct oversize_requests {
    using option_kind = option_kind::oversize;
    static constexpr void apply(engine_settings& e) { e.on_oversize = O; }
};

//! How the buckets' executable graphs are kept (per bucket, or one updated in place).
template <bucket_exec X>
struct bucket_execs {
    using option_kind = option_kind::bucket_exec;
    static constexpr void apply(engine_settings& e) { e.execs = X; }
};

} // namespace capscope
