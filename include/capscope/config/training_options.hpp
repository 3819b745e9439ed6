#pragma once
//! @file
//! Training-loop facts: layer-level CPU offloading, the NaN check, inference batching,
//! the transformer implementation and Megatron-FSDP.

#include <capscope/config/option.hpp>

namespace capscope {

//! `--cpu-offloading-num-layers N` (layer-level offloading, not fine-grained).
template <int N>
struct layer_cpu_offloading {
    using option_kind = option_kind::training_fact_cpu_offload;
    static constexpr void apply(runtime_config& c) { c.cpu_offloading_num_layers = N; }
};

//! `--no-check-for-nan-in-loss-and-grad`.
struct no_nan_check {
    using option_kind = option_kind::nan_check;
    static constexpr void apply(runtime_config& c) { c.check_for_nan_in_loss_and_grad = false; }
};

//! The NaN/inf check of loss and gradients, on the device (capscope's engine; Megatron has no such
//! flag): a captured kernel writes an "all finite" flag and the optimizer is guarded by it
//! (`run_if`, docs/guards.md), so a step with a non-finite value skips its update inside the
//! graph. It composes with `impl::whole_iteration` (rule A1 is about a check that syncs the host).
//! The runner checks that the program's optimizer is guarded (plan rule P17).
struct nan_check_on_device {
    using option_kind = option_kind::nan_check;
    static constexpr void apply(runtime_config& c) {
        c.check_for_nan_in_loss_and_grad = true;
        c.nan_check_on_device = true;
    }
};

//! Dropless MoE captured (capscope's engine; Megatron has no such flag, and its rule S6 keeps
//! `moe` out of graphs for dropless MoE): the trainer's MoE layers size their expert batches for a
//! static per-expert capacity, a kernel flags a step in which an expert got more tokens than
//! that, the optimizer is guarded so that step moves no weight, and the runner reruns it eagerly,
//! dropless (training_program::rerun, docs/guards.md). With it, `modules<moe>` is valid on a
//! dropless model. The runner checks that the program declares the rerun (plan rule P18).
struct static_expert_capacity {
    using option_kind = option_kind::expert_capacity;
    static constexpr void apply(runtime_config& c) { c.static_expert_capacity = true; }
};

//! `--inference-batch-times-seqlen-threshold N` (pipeline-parallel microbatched inference when N > -1).
template <int N>
struct pipeline_parallel_inference {
    using option_kind = option_kind::pp_inference;
    static constexpr void apply(runtime_config& c) { c.inference_batch_times_seqlen_threshold = N; }
};

//! `--inference-dynamic-batching-num-cuda-graphs N`.
template <int N>
struct dynamic_batching_graphs {
    using option_kind = option_kind::dynamic_batching;
    static constexpr void apply(runtime_config& c) { c.inference_dynamic_batching_num_cuda_graphs = N; }
};

//! `--transformer-impl`.
template <transformer_impl T>
struct transformer {
    using option_kind = option_kind::transformer;
    static constexpr void apply(runtime_config& c) { c.transformer = T; }
};

//! `--fp8-format F`: fp8 training.
template <fp8_format F>
struct fp8 {
    using option_kind = option_kind::fp8;
    static constexpr void apply(runtime_config& c) { c.fp8 = F; }
};

//! `--fp8-recipe R`.
template <fp8_recipe R>
struct fp8_scaling {
    using option_kind = option_kind::fp8_recipe;
    static constexpr void apply(runtime_config& c) { c.fp8_scaling = R; }
};

// --- Megatron-FSDP -----------------------------------------------------------------------
namespace detail {
template <class T>
concept fsdp_flag = requires(fsdp_settings& s) {
    typename T::fsdp_flag_tag;
    T::apply(s);
};
struct fsdp_flag_base { using fsdp_flag_tag = void; };
} // namespace detail

struct fsdp_double_buffer : detail::fsdp_flag_base { static constexpr void apply(fsdp_settings& s) { s.double_buffer = true; } };
struct fsdp_persistent_buffer_on_alloc_fail : detail::fsdp_flag_base {
    static constexpr void apply(fsdp_settings& s) { s.persistent_buffer_on_alloc_fail = true; }
};
struct fsdp_nccl_user_buffers : detail::fsdp_flag_base { static constexpr void apply(fsdp_settings& s) { s.nccl_user_buffers = true; } };
struct fsdp_max_pool_double_buffer : detail::fsdp_flag_base {
    static constexpr void apply(fsdp_settings& s) { s.max_pool_double_buffer = true; }
};

//! `--use-megatron-fsdp` (v1; v2 adds `--megatron-fsdp-version 2`) with its buffer flags.
template <fsdp_mode Mode, class... Flags>
struct megatron_fsdp {
    static_assert((detail::fsdp_flag<Flags> && ...),
                  "capscope::megatron_fsdp<mode, ...> takes fsdp_double_buffer, fsdp_persistent_buffer_on_alloc_fail, "
                  "fsdp_nccl_user_buffers, fsdp_max_pool_double_buffer");
    using option_kind = option_kind::fsdp;
    static constexpr void apply(runtime_config& c) {
        c.fsdp.mode = Mode;
        (Flags::apply(c.fsdp), ...);
    }
};

} // namespace capscope
