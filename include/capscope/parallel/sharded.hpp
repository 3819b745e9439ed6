#pragma once
//! @file
//! Sharded data parallelism on hooks (FSDP / ZeRO-3 style), with NCCL: every rank keeps a shard of
//! each layer's parameters and gradients; a forward-pre hook all-gathers the layer's parameters
//! into a static full buffer (parallel/sharding.hpp: F1, F2), and a backward hook reduce-scatters
//! the layer's full gradients into the rank's gradient shard after the last microbatch, on a side
//! stream. The optimizer then steps the shard only. A layer's gather can be prefetched (the
//! policy's default, `sharded<..., prefetch_next_layer>`; the hooks take it as their last
//! argument): it runs while the layer before it in the pass computes (one_layer_ahead), into the
//! other half of the double buffer, ordered after the layer that last read that half, as the
//! plan derives. The hooks are capturable: under per-layer impls each is a graph of its own on
//! the side stream, beside the layer's; under the whole iteration, a branch of the step's graph.
//! Every collective goes on the same side stream (lane 1 by default), so they run one after
//! another in the order issued, the same on every rank: NCCL orders the collectives of one
//! communicator when they are launched eagerly, but graphs launched on different streams would
//! not be ordered against each other.

#include <capscope/cuda/nccl.hpp>
#include <capscope/hooks/hook.hpp>
#include <capscope/parallel/data_parallel.hpp>
#include <capscope/parallel/sharding.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace capscope {

//! One layer's buffers under sharding: `shard` elements per rank of type `type`. The hooks index
//! a span of these by layer; the trainer keeps the span's storage (and the buffers) alive.
struct sharded_layer_buffers {
    void* parameter_shard = nullptr; //!< this rank's shard (what the optimizer steps)
    void* parameter_full = nullptr;  //!< the gathered parameters: static (a double buffer, or its own)
    void* gradient_full = nullptr;   //!< the layer's gradients, accumulated over microbatches
    void* gradient_shard = nullptr;  //!< this rank's reduced shard of them
    std::size_t shard = 0;                      //!< elements per rank, of both parameters and gradients
    ncclDataType_t parameter_type = ncclFloat32; //!< the working copy's type (bf16 under mixed precision)
    ncclDataType_t gradient_type = ncclFloat32;
};

namespace detail {
//! For the plan's fingerprint: what a sharded collective on `layer` moves (its declared buffer
//! gives bytes, not the type).
inline std::string shard_call_words(std::span<const sharded_layer_buffers> layers, int layer, ncclDataType_t sharded_layer_buffers::*type) {
    if (std::size_t(layer) >= layers.size()) return "no buffers for layer " + std::to_string(layer);
    const sharded_layer_buffers& b = layers[std::size_t(layer)];
    return std::to_string(b.shard) + " elements of NCCL type " + std::to_string(int(b.*type)) + " per rank";
}

//! All-gathers the layer's parameter shards into its full buffer, before its forward or its backward.
template <hook_phase P>
struct parameter_gather {
    ncclComm_t comm;
    std::span<const sharded_layer_buffers> layers;
    void operator()(hook_context<P>& c) const {
        const sharded_layer_buffers& b = layers[std::size_t(c.layer())];
        CAPSCOPE_CHECK(ncclAllGather(b.parameter_shard, b.parameter_full, b.shard, b.parameter_type, comm, c.stream()));
    }
    std::string collective_calls(int layer) const { return shard_call_words(layers, layer, &sharded_layer_buffers::parameter_type); }
};
struct gradient_scatter {
    ncclComm_t comm;
    std::span<const sharded_layer_buffers> layers;
    ncclRedOp_t op;
    std::shared_ptr<const all_to_all_sum> all_to_all = {}; //!< reduce_scatter_as::all_to_all_then_sum: its scratch and cuBLAS handle
    void operator()(backward_context& c) const {
        const sharded_layer_buffers& b = layers[std::size_t(c.layer())];
        if (all_to_all) all_to_all->reduce_scatter(b.gradient_full, b.gradient_shard, b.shard, c.stream());
        else CAPSCOPE_CHECK(ncclReduceScatter(b.gradient_full, b.gradient_shard, b.shard, b.gradient_type, op, comm, c.stream()));
    }
    std::string collective_calls(int layer) const {
        return shard_call_words(layers, layer, &sharded_layer_buffers::gradient_type) + ", operation " + std::to_string(int(op)) +
               (all_to_all ? ", an all-to-all then a sum" : "");
    }
};

template <hook_phase P, int Lane, class Gather, class... Once>
auto gather_hook(std::string_view name, const cuda::nccl_communicator& comm, std::span<const sharded_layer_buffers> layers) {
    if constexpr (std::is_same_v<Gather, prefetch_next_layer>)
        return hook<P, capturable, on_lane<Lane>, one_layer_ahead, Once...>(name, parameter_gather<P>{comm.get(), layers});
    else return hook<P, capturable, on_lane<Lane>, Once...>(name, parameter_gather<P>{comm.get(), layers});
}
} // namespace detail

//! The forward-pre hook: all-gathers layer L's parameter shards into its full buffer, on side
//! stream `Lane` (the layer's forward waits for it there). `gather_on_demand` (the default) runs
//! it right before layer L; `prefetch_next_layer{}` while layer L - 1 computes (one_layer_ahead:
//! consecutive layers need buffers of their own, as a double buffer gives them).
template <int Lane = 1, class Gather = gather_on_demand>
auto parameter_all_gather(const cuda::nccl_communicator& comm, std::span<const sharded_layer_buffers> layers, Gather = {}) {
    return detail::gather_hook<hook_phase::forward_pre, Lane, Gather>("param all-gather", comm, layers);
}
//! The forward-pre hook of `sharded<..., keep_for_backward>`, where each layer's gathered copy
//! has a buffer of its own for the step: the step's first microbatch gathers it, and the later
//! ones read what it gathered (nothing changes the parameters before the optimizer), so a step
//! gathers once, not once per microbatch. Otherwise as `parameter_all_gather`.
template <int Lane = 1, class Gather = gather_on_demand>
auto parameter_all_gather_once_per_step(const cuda::nccl_communicator& comm, std::span<const sharded_layer_buffers> layers, Gather = {}) {
    return detail::gather_hook<hook_phase::forward_pre, Lane, Gather, first_microbatch_only>("param all-gather (once a step)", comm, layers);
}
//! The backward-pre hook of `sharded<..., regather_for_backward>`: gathers them again before the
//! layer's backward (when the full buffer was reused by another layer in between), on `Lane`;
//! prefetched (`prefetch_next_layer{}`), while layer L + 1's backward runs.
template <int Lane = 1, class Gather = gather_on_demand>
auto parameter_regather(const cuda::nccl_communicator& comm, std::span<const sharded_layer_buffers> layers, Gather = {}) {
    return detail::gather_hook<hook_phase::backward_pre, Lane, Gather>("param re-gather", comm, layers);
}
//! How the gradients' reduce-scatter is issued.
enum class reduce_scatter_as {
    one_call, //!< `ncclReduceScatter`
    //! `ncclAlltoAll` of the parts into a scratch window, then this rank's part summed by cuBLAS
    //! (capscope/parallel/all_to_all_reduction.hpp): with the full gradients in symmetric windows
    //! on a `nccl_cta_policy::zero` communicator, every byte moves on copy engines and only the
    //! sum takes SMs. Float32 and float64, sum or average; a scratch of the largest layer's full
    //! gradients, made here on every rank.
    all_to_all_then_sum,
};

//! The backward hook: reduce-scatters layer L's gradients into this rank's shard, in the step's
//! last microbatch (earlier ones accumulate into `gradient_full`), on side stream `Lane` (so it
//! overlaps the backward of the layers before it; the optimizer waits for it).
template <int Lane = 1>
auto gradient_reduce_scatter(const cuda::nccl_communicator& comm, std::span<const sharded_layer_buffers> layers, ncclRedOp_t op = ncclAvg,
                             reduce_scatter_as as = reduce_scatter_as::one_call) {
    std::shared_ptr<const detail::all_to_all_sum> all_to_all;
    if (as == reduce_scatter_as::all_to_all_then_sum && !layers.empty()) {
        std::size_t largest = 0;
        for (const sharded_layer_buffers& b : layers) {
            if (b.gradient_type != layers.front().gradient_type)
                throw std::invalid_argument("gradient_reduce_scatter: reduce_scatter_as::all_to_all_then_sum sums one type, and the layers' "
                                            "gradients differ -- fix: one gradient type, or reduce_scatter_as::one_call");
            largest = std::max(largest, b.shard * std::size_t(comm.size()) * detail::nccl_type_bytes(b.gradient_type));
        }
        all_to_all = std::make_shared<const detail::all_to_all_sum>(comm, layers.front().gradient_type, op, largest);
    }
    return hook<hook_phase::backward, capturable, on_lane<Lane>, last_microbatch_only>("grad reduce-scatter",
                                                                                      detail::gradient_scatter{comm.get(), layers, op, std::move(all_to_all)});
}

} // namespace capscope
