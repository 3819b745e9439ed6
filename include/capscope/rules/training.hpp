#pragma once
//! @file
//! Training-loop rules that involve CUDA graphs (spec §2.3 E1, §2.4 A1/A2/A3/A6) and
//! Megatron-FSDP (spec §5.2: F1, F2, F4 and the v1/v2 cases X10, X11).

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

namespace detail {
constexpr bool fsdp_double_buffer_implied(const runtime_config& c) {
    return c.fsdp.mode != fsdp_mode::off && !c.fsdp.double_buffer &&
           (c.fsdp.nccl_user_buffers || c.fsdp.max_pool_double_buffer);
}
constexpr bool fsdp_v1_per_layer(const runtime_config& c) {
    return c.fsdp.mode == fsdp_mode::v1 && c.impl != graph_impl::eager && c.impl != graph_impl::whole_iteration;
}
} // namespace detail

CAPSCOPE_RULE(E1, error, training,
    "No transformer_engine moe/mlp graphs with expert-parallel comm overlap",
    "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm when cuda_graph_impl=transformer_engine",
    "drop moe/mlp from the modules, or --overlap-moe-expert-parallel-comm",
    nullptr,
    [](const runtime_config& c) {
        return c.overlap_moe_expert_parallel_comm && c.impl == graph_impl::ahead_of_time_per_layer &&
               (c.captures(capture_module::moe) || c.captures(capture_module::mlp));
    });

CAPSCOPE_RULE(A1, error, training,
    "A full-iteration graph runs without the NaN check in loss and grad",
    "--no-check-for-nan-in-loss-and-grad should be set with cuda_graph_impl=full_iteration (the check syncs the host inside the graph)",
    "add --no-check-for-nan-in-loss-and-grad (no_nan_check); or, in capscope's engine, check on the device (nan_check_on_device) with the optimizer guarded by the result",
    nullptr,
    [](const runtime_config& c) { return c.impl == graph_impl::whole_iteration && c.check_for_nan_in_loss_and_grad && !c.nan_check_on_device; });

CAPSCOPE_RULE(A2, error, training,
    "A block inference graph with fp8 runs inference_optimized layers with the mxfp8 recipe",
    "fp8 with inference_cuda_graph_scope=block is only supported with --transformer-impl inference_optimized and --fp8-recipe mxfp8",
    "use --transformer-impl inference_optimized --fp8-recipe mxfp8 (transformer<transformer_impl::inference_optimized>, fp8_scaling<fp8_recipe::mxfp8>), or inference scope layer, or no fp8",
    nullptr,
    [](const runtime_config& c) {
        return c.inference == inference_scope::per_block && c.fp8.has_value() &&
               (c.transformer != transformer_impl::inference_optimized || c.fp8_scaling != fp8_recipe::mxfp8);
    });

CAPSCOPE_RULE(A3, error, training,
    "Local graphs for dynamic batching need a positive graph count (or -1)",
    "inference_dynamic_batching_num_cuda_graphs must be > 0 or exactly -1 with cuda_graph_impl=local",
    "set --inference-dynamic-batching-num-cuda-graphs to a positive number or -1",
    nullptr,
    [](const runtime_config& c) {
        int n = c.inference_dynamic_batching_num_cuda_graphs;
        return c.impl == graph_impl::lazy_per_layer && !(n > 0 || n == -1);
    });

CAPSCOPE_RULE(A6, error, training,
    "Pipeline-parallel microbatched inference runs without CUDA graphs",
    "pipeline-parallel microbatched inference (--inference-batch-times-seqlen-threshold > -1) is incompatible with CUDA graphs",
    "set --cuda-graph-impl none, or --inference-batch-times-seqlen-threshold -1",
    nullptr,
    [](const runtime_config& c) { return c.inference_batch_times_seqlen_threshold > -1 && c.impl != graph_impl::eager; });

CAPSCOPE_RULE(F4, migration, fsdp,
    "With Megatron-FSDP, --use-nccl-ub or --megatron-fsdp-max-pool-double-buffer turn the double buffer on",
    "Megatron-FSDP double buffer enabled by --use-nccl-ub / --megatron-fsdp-max-pool-double-buffer",
    "write --fsdp-double-buffer explicitly",
    [](runtime_config& c) { c.fsdp.double_buffer = true; },
    detail::fsdp_double_buffer_implied);

CAPSCOPE_RULE(X10, error, fsdp,
    "Megatron-FSDP v1 with expert-parallel comm overlap: no double buffer, no per-layer graphs",
    "1F1B overlap with FSDP does not support per-layer CUDA graphs or fsdp_double_buffer (Megatron-FSDP v1 with overlap_moe_expert_parallel_comm)",
    "use --cuda-graph-impl none or full_iteration and no --fsdp-double-buffer, or drop --overlap-moe-expert-parallel-comm",
    nullptr,
    [](const runtime_config& c) {
        return c.fsdp.mode == fsdp_mode::v1 && c.overlap_moe_expert_parallel_comm &&
               (c.fsdp.double_buffer || (c.impl != graph_impl::eager && c.impl != graph_impl::whole_iteration));
    });

CAPSCOPE_RULE(X11, error, fsdp,
    "Megatron-FSDP v2 runs without CUDA graphs and without the persistent-buffer fallback",
    "MFSDP v2 does not currently support CUDA graphs, nor fsdp_db_use_persist_buf_on_alloc_fail",
    "use Megatron-FSDP v1 (--megatron-fsdp-version 1), or --cuda-graph-impl none without --fsdp-db-use-persist-buf-on-alloc-fail",
    nullptr,
    [](const runtime_config& c) {
        return c.fsdp.mode == fsdp_mode::v2 && (c.impl != graph_impl::eager || c.fsdp.persistent_buffer_on_alloc_fail);
    });

CAPSCOPE_RULE(F1, error, fsdp,
    "Per-layer graphs with Megatron-FSDP need the double buffer",
    "per-layer CUDA graphs with Megatron-FSDP require --fsdp-double-buffer (otherwise parameter buffer addresses change between iterations and replay reads stale memory)",
    "add --fsdp-double-buffer",
    nullptr,
    [](const runtime_config& c) { return detail::fsdp_v1_per_layer(c) && !c.fsdp.double_buffer; });

CAPSCOPE_RULE(F2, error, fsdp,
    "Per-layer graphs with Megatron-FSDP need the persistent buffer on allocation failure",
    "per-layer CUDA graphs with Megatron-FSDP require --fsdp-db-use-persist-buf-on-alloc-fail (an allocation that misses the double-buffer pool lands in a dynamic buffer: illegal memory access on replay)",
    "add --fsdp-db-use-persist-buf-on-alloc-fail",
    nullptr,
    [](const runtime_config& c) { return detail::fsdp_v1_per_layer(c) && !c.fsdp.persistent_buffer_on_alloc_fail; });

} // namespace capscope::rules
