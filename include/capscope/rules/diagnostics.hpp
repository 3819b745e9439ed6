#pragma once
//! @file
//! The compile-time diagnostic of each rule that rejects a `config<...>`: instantiating
//! `rejected<I, Config>` for the I-th rule of the table fails one static_assert whose text is
//! "capscope rule <ID>: <message> -- fix: <fix>". GENERATED from the rule table by
//! tools/rule_diagnostics (a unit test fails when this file is stale); do not edit.

#include <capscope/rules/rule.hpp>

namespace capscope::rule_diagnostics {

template <int Rule, class Config>
struct rejected; // defined for the rules that reject at compile time only

template <class Config>
struct rejected<0, Config> { // N1
    static_assert(detail::always_false<Config>,
                  "capscope rule N1: Do not use enable_cuda_graph or external_cuda_graph with cuda_graph_impl (legacy flag given together with an explicit implementation) -- fix: drop --enable-cuda-graph/--external-cuda-graph (deprecated::enable_cuda_graph/external_cuda_graph) and keep only --cuda-graph-impl");
};
template <class Config>
struct rejected<1, Config> { // N2
    static_assert(detail::always_false<Config>,
                  "capscope rule N2: enable_cuda_graph and external_cuda_graph cannot be enabled at the same time -- fix: use --cuda-graph-impl local (impl::lazy_per_layer) or --cuda-graph-impl transformer_engine (impl::ahead_of_time_per_layer) instead of both legacy flags");
};
template <class Config>
struct rejected<4, Config> { // N4
    static_assert(detail::always_false<Config>,
                  "capscope rule N4: cuda_graph_scope and cuda_graph_modules cannot be set together -- fix: move the --cuda-graph-scope values (deprecated::cuda_graph_scope<...>) into --cuda-graph-modules (modules<...>)");
};
template <class Config>
struct rejected<6, Config> { // N5
    static_assert(detail::always_false<Config>,
                  "capscope rule N5: full scope cannot be used with other scopes -- fix: drop 'full': an empty cuda_graph_modules (modules<>) already means the whole layer");
};
template <class Config>
struct rejected<8, Config> { // N6
    static_assert(detail::always_false<Config>,
                  "capscope rule N6: cuda_graph_modules entries must be strings or CudaGraphModule enums naming one of attn, mlp, moe, moe_router, moe_preprocess, mamba -- fix: use only attn, mlp, moe, moe_router, moe_preprocess, mamba (capture::attention, capture::mlp, ...)");
};
template <class Config>
struct rejected<9, Config> { // N7
    static_assert(detail::always_false<Config>,
                  "capscope rule N7: cuda_graph_modules cannot contain multiple deprecated values (full_iteration and full_iteration_inference) at the same time -- fix: keep one: --cuda-graph-impl full_iteration for training, --inference-cuda-graph-scope block for inference");
};
template <class Config>
struct rejected<10, Config> { // N8a
    static_assert(detail::always_false<Config>,
                  "capscope rule N8a: cuda_graph_modules 'full_iteration' cannot be combined with cuda_graph_impl=transformer_engine -- fix: use --cuda-graph-impl full_iteration (impl::whole_iteration) and drop 'full_iteration' from the modules");
};
template <class Config>
struct rejected<11, Config> { // N8b
    static_assert(detail::always_false<Config>,
                  "capscope rule N8b: cuda_graph_modules 'full_iteration' cannot be combined with inference_cuda_graph_scope=layer/block -- fix: use --cuda-graph-impl full_iteration without --inference-cuda-graph-scope, or inference graphs with --cuda-graph-impl local");
};
template <class Config>
struct rejected<13, Config> { // N8d
    static_assert(detail::always_false<Config>,
                  "capscope rule N8d: cuda_graph_modules 'full_iteration_inference' cannot be combined with cuda_graph_impl=transformer_engine or full_iteration -- fix: use --cuda-graph-impl local --inference-cuda-graph-scope block (impl::lazy_per_layer, inference::per_block)");
};
template <class Config>
struct rejected<14, Config> { // N8e
    static_assert(detail::always_false<Config>,
                  "capscope rule N8e: cuda_graph_modules 'full_iteration_inference' cannot be combined with inference_cuda_graph_scope=none/layer -- fix: drop 'full_iteration_inference' and write --inference-cuda-graph-scope block (inference::per_block)");
};
template <class Config>
struct rejected<17, Config> { // N9
    static_assert(detail::always_false<Config>,
                  "capscope rule N9: Invalid cuda graph implementation -- fix: use none, local, transformer_engine or full_iteration (impl::eager, impl::lazy_per_layer, impl::ahead_of_time_per_layer, impl::whole_iteration)");
};
template <class Config>
struct rejected<19, Config> { // N11
    static_assert(detail::always_false<Config>,
                  "capscope rule N11: Invalid inference CUDA graph scope for this cuda_graph_impl (none, transformer_engine and full_iteration allow only none; local allows layer or block) -- fix: use --cuda-graph-impl local (impl::lazy_per_layer) for inference graphs, or drop --inference-cuda-graph-scope");
};
template <class Config>
struct rejected<20, Config> { // A1
    static_assert(detail::always_false<Config>,
                  "capscope rule A1: --no-check-for-nan-in-loss-and-grad should be set with cuda_graph_impl=full_iteration (the check syncs the host inside the graph) -- fix: add --no-check-for-nan-in-loss-and-grad (no_nan_check); or, in capscope's engine, check on the device (nan_check_on_device) with the optimizer guarded by the result");
};
template <class Config>
struct rejected<21, Config> { // A2
    static_assert(detail::always_false<Config>,
                  "capscope rule A2: fp8 with inference_cuda_graph_scope=block is only supported with --transformer-impl inference_optimized and --fp8-recipe mxfp8 -- fix: use --transformer-impl inference_optimized --fp8-recipe mxfp8 (transformer<transformer_impl::inference_optimized>, fp8_scaling<fp8_recipe::mxfp8>), or inference scope layer, or no fp8");
};
template <class Config>
struct rejected<22, Config> { // A3
    static_assert(detail::always_false<Config>,
                  "capscope rule A3: inference_dynamic_batching_num_cuda_graphs must be > 0 or exactly -1 with cuda_graph_impl=local -- fix: set --inference-dynamic-batching-num-cuda-graphs to a positive number or -1");
};
template <class Config>
struct rejected<23, Config> { // A6
    static_assert(detail::always_false<Config>,
                  "capscope rule A6: pipeline-parallel microbatched inference (--inference-batch-times-seqlen-threshold > -1) is incompatible with CUDA graphs -- fix: set --cuda-graph-impl none, or --inference-batch-times-seqlen-threshold -1");
};
template <class Config>
struct rejected<24, Config> { // O10
    static_assert(detail::always_false<Config>,
                  "capscope rule O10: fine-grained activation offloading is only supported with --transformer-impl transformer_engine -- fix: use --transformer-impl transformer_engine (transformer<transformer_impl::transformer_engine>), or drop --fine-grained-activation-offloading");
};
template <class Config>
struct rejected<25, Config> { // N12
    static_assert(detail::always_false<Config>,
                  "capscope rule N12: cuda_graph_modules must be empty when cuda_graph_impl=\"full_iteration\" -- fix: drop --cuda-graph-modules (modules<...>): the whole iteration is one graph");
};
template <class Config>
struct rejected<26, Config> { // R0
    static_assert(detail::always_false<Config>,
                  "capscope rule R0: Invalid choices for recompute_modules (TransformerConfig allows core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts) -- fix: pass --recompute-modules with valid names (recompute<granularity, recompute_module::...>)");
};
template <class Config>
struct rejected<27, Config> { // O1
    static_assert(detail::always_false<Config>,
                  "capscope rule O1: fine-grained activation offloading cannot be combined with layer-level CPU offloading (--cpu-offloading-num-layers > 0) -- fix: choose one: drop --fine-grained-activation-offloading or set --cpu-offloading-num-layers 0");
};
template <class Config>
struct rejected<28, Config> { // O2
    static_assert(detail::always_false<Config>,
                  "capscope rule O2: Invalid choices for offload_modules: it must be non-empty and list only attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp, gdp_qkv -- fix: pass --offload-modules with valid names (offload_modules<offload_module::...>)");
};
template <class Config>
struct rejected<29, Config> { // O3
    static_assert(detail::always_false<Config>,
                  "capscope rule O3: offloading attn_proj requires offloading core_attn -- fix: add core_attn to --offload-modules or drop attn_proj");
};
template <class Config>
struct rejected<30, Config> { // O5
    static_assert(detail::always_false<Config>,
                  "capscope rule O5: selective recompute of moe cannot be combined with offloading moe_act, expert_fc1 or fused_group_mlp -- fix: drop moe from --recompute-modules, or the expert modules from --offload-modules");
};
template <class Config>
struct rejected<31, Config> { // O6
    static_assert(detail::always_false<Config>,
                  "capscope rule O6: min_offloaded_tensor_size and delta_offload_bytes_across_pp_ranks must be >= 0 and activation_offload_fraction in [0, 1] -- fix: fix --min-offloaded-tensor-size, --delta-offload-bytes-across-pp-ranks or --activation-offload-fraction");
};
template <class Config>
struct rejected<32, Config> { // O7
    static_assert(detail::always_false<Config>,
                  "capscope rule O7: offloading fused_group_mlp requires --use-transformer-engine-op-fuser and cannot be combined with expert_fc1 or moe_act -- fix: enable --use-transformer-engine-op-fuser and offload fused_group_mlp alone among the expert modules");
};
template <class Config>
struct rejected<33, Config> { // S0
    static_assert(detail::always_false<Config>,
                  "capscope rule S0: CUDA graphs not supported with CPU offloading (--cpu-offloading-num-layers > 0) -- fix: set --cpu-offloading-num-layers 0, or use --cuda-graph-impl full_iteration (impl::whole_iteration)");
};
template <class Config>
struct rejected<34, Config> { // S1
    static_assert(detail::always_false<Config>,
                  "capscope rule S1: cuda_graph_impl=local does not distinguish moe_router from moe_preprocess; Megatron adds the missing one -- fix: list both moe_router and moe_preprocess (capture::moe_router, capture::moe_preprocess)");
};
template <class Config>
struct rejected<35, Config> { // S2
    static_assert(detail::always_false<Config>,
                  "capscope rule S2: cuda_graph_modules must not contain both moe and moe_router -- fix: capture either moe (the whole MoE block, drop-and-pad only) or moe_router [+ moe_preprocess]");
};
template <class Config>
struct rejected<36, Config> { // S3
    static_assert(detail::always_false<Config>,
                  "capscope rule S3: moe_preprocess cuda graph is only supported with moe_router cuda graph -- fix: add moe_router (capture::moe_router) or drop moe_preprocess");
};
template <class Config>
struct rejected<37, Config> { // S4
    static_assert(detail::always_false<Config>,
                  "capscope rule S4: moe cuda graph is only supported for MoE (the model has no experts: --num-experts unset or <= 1) -- fix: drop moe/moe_router/moe_preprocess from the modules, or give the model experts (--num-experts > 1)");
};
template <class Config>
struct rejected<38, Config> { // S5
    static_assert(detail::always_false<Config>,
                  "capscope rule S5: mlp cuda graph is only supported for dense layers, and every layer of this MoE model is an MoE layer -- fix: drop mlp from the modules, or capture moe/moe_router for the MoE layers");
};
template <class Config>
struct rejected<39, Config> { // S6
    static_assert(detail::always_false<Config>,
                  "capscope rule S6: moe cuda graph is only supported with drop-padding MoE (needs --moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity) -- fix: capture moe_router [+ moe_preprocess] instead of moe, or make the MoE drop-and-pad (in capscope's engine, static_expert_capacity keeps it dropless, a step past the capacity rerun eagerly)");
};
template <class Config>
struct rejected<40, Config> { // S7
    static_assert(detail::always_false<Config>,
                  "capscope rule S7: moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the preprocess step (alltoall dispatcher with a capacity factor or fp8 router padding, not drop-and-pad) -- fix: drop moe_preprocess (capture moe_router only), or make the MoE drop-and-pad");
};
template <class Config>
struct rejected<41, Config> { // R1
    static_assert(detail::always_false<Config>,
                  "capscope rule R1: full recompute is only supported with full iteration CUDA graph -- fix: use --recompute-granularity selective, or --cuda-graph-impl full_iteration (impl::whole_iteration)");
};
template <class Config>
struct rejected<42, Config> { // R2
    static_assert(detail::always_false<Config>,
                  "capscope rule R2: moe recompute is not supported with moe_router CUDA graph when cuda_graph_impl=transformer_engine -- fix: drop moe from --recompute-modules, or moe_router from the modules");
};
template <class Config>
struct rejected<43, Config> { // R3
    static_assert(detail::always_false<Config>,
                  "capscope rule R3: attention dropout is not supported with graphed attention recomputation (core_attn recomputed inside a graph while --attention-dropout != 0) -- fix: set --attention-dropout 0, drop core_attn from --recompute-modules, or capture modules that exclude attn");
};
template <class Config>
struct rejected<44, Config> { // R4
    static_assert(detail::always_false<Config>,
                  "capscope rule R4: hidden dropout is not supported with graphed MLP/MoE recomputation (mlp or moe recomputed inside a graph while --hidden-dropout != 0) -- fix: set --hidden-dropout 0, drop mlp/moe from --recompute-modules, or stop capturing that region");
};
template <class Config>
struct rejected<45, Config> { // R5
    static_assert(detail::always_false<Config>,
                  "capscope rule R5: moe_input_jitter_eps is not supported with graphed moe recomputation -- fix: unset --moe-input-jitter-eps, drop moe from --recompute-modules, or stop capturing moe");
};
template <class Config>
struct rejected<46, Config> { // OC1
    static_assert(detail::always_false<Config>,
                  "capscope rule OC1: fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules 'expert_fc1', 'moe_act', and 'fused_group_mlp' -- fix: offload only expert_fc1/moe_act/fused_group_mlp, or use --cuda-graph-impl transformer_engine");
};
template <class Config>
struct rejected<47, Config> { // OC2
    static_assert(detail::always_false<Config>,
                  "capscope rule OC2: fine-grained activation offloading with cuda_graph_impl='local' is not supported with whole-layer CUDA graph capture (empty cuda_graph_modules) -- fix: list the captured modules explicitly, e.g. --cuda-graph-modules attn moe_router moe_preprocess");
};
template <class Config>
struct rejected<48, Config> { // OC3
    static_assert(detail::always_false<Config>,
                  "capscope rule OC3: fine-grained activation offloading is only supported with cuda_graph_impl transformer_engine or full_iteration, or local with partial MoE offload -- fix: use --cuda-graph-impl transformer_engine or full_iteration, or with local offload only MoE expert inputs without capturing moe");
};
template <class Config>
struct rejected<49, Config> { // OC4
    static_assert(detail::always_false<Config>,
                  "capscope rule OC4: Token-drop MoE is temporarily not supported with activation offloading (moe is captured) -- fix: capture moe_router [+ moe_preprocess] instead of moe");
};
template <class Config>
struct rejected<50, Config> { // OC5
    static_assert(detail::always_false<Config>,
                  "capscope rule OC5: cuda_graph_warmup_steps must be greater than 0 when fine-grained activation offloading is used with CUDA graphs -- fix: set --cuda-graph-warmup-steps 1 or more (warmup_steps<N>)");
};
template <class Config>
struct rejected<51, Config> { // OC6
    static_assert(detail::always_false<Config>,
                  "capscope rule OC6: fine_grained_offloading_max_inflight_offloads must be a non-negative integer with full-iteration CUDA graphs -- fix: set --fine-grained-offloading-max-inflight-offloads N with N >= 0 (max_inflight_offloads<N>)");
};
template <class Config>
struct rejected<52, Config> { // OB1
    static_assert(detail::always_false<Config>,
                  "capscope rule OB1: attn_norm's input crosses the attn graph boundary; Megatron silently disables its offload -- fix: drop attn_norm from the offload modules");
};
template <class Config>
struct rejected<53, Config> { // OB2
    static_assert(detail::always_false<Config>,
                  "capscope rule OB2: mlp_norm's input crosses a graph boundary (MoE layer with attn or moe_router captured, or dense layer with exactly one of attn/mlp); Megatron silently disables its offload there -- fix: drop mlp_norm from the offload modules, or capture both attn and mlp");
};
template <class Config>
struct rejected<54, Config> { // E1
    static_assert(detail::always_false<Config>,
                  "capscope rule E1: CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm when cuda_graph_impl=transformer_engine -- fix: drop moe/mlp from the modules, or --overlap-moe-expert-parallel-comm");
};
template <class Config>
struct rejected<56, Config> { // X10
    static_assert(detail::always_false<Config>,
                  "capscope rule X10: 1F1B overlap with FSDP does not support per-layer CUDA graphs or fsdp_double_buffer (Megatron-FSDP v1 with overlap_moe_expert_parallel_comm) -- fix: use --cuda-graph-impl none or full_iteration and no --fsdp-double-buffer, or drop --overlap-moe-expert-parallel-comm");
};
template <class Config>
struct rejected<57, Config> { // X11
    static_assert(detail::always_false<Config>,
                  "capscope rule X11: MFSDP v2 does not currently support CUDA graphs, nor fsdp_db_use_persist_buf_on_alloc_fail -- fix: use Megatron-FSDP v1 (--megatron-fsdp-version 1), or --cuda-graph-impl none without --fsdp-db-use-persist-buf-on-alloc-fail");
};
template <class Config>
struct rejected<58, Config> { // F1
    static_assert(detail::always_false<Config>,
                  "capscope rule F1: per-layer CUDA graphs with Megatron-FSDP require --fsdp-double-buffer (otherwise parameter buffer addresses change between iterations and replay reads stale memory) -- fix: add --fsdp-double-buffer");
};
template <class Config>
struct rejected<59, Config> { // F2
    static_assert(detail::always_false<Config>,
                  "capscope rule F2: per-layer CUDA graphs with Megatron-FSDP require --fsdp-db-use-persist-buf-on-alloc-fail (an allocation that misses the double-buffer pool lands in a dynamic buffer: illegal memory access on replay) -- fix: add --fsdp-db-use-persist-buf-on-alloc-fail");
};
template <class Config>
struct rejected<60, Config> { // V1
    static_assert(detail::always_false<Config>,
                  "capscope rule V1: vision_cuda_graph_impl must be none or transformer_engine (only transformer_engine captures vision layers) -- fix: set vision_cuda_graph_impl to transformer_engine (vision<impl::ahead_of_time_per_layer, ...>) or none");
};
template <class Config>
struct rejected<61, Config> { // V2
    static_assert(detail::always_false<Config>,
                  "capscope rule V2: vision_cuda_graph_scope may list only attn and mlp (the vision encoder has dense transformer layers only) -- fix: list attn and/or mlp, or nothing for whole layers");
};
template <class Config>
struct rejected<62, Config> { // V3
    static_assert(detail::always_false<Config>,
                  "capscope rule V3: max_vision_cuda_graph_seq_length must be a positive number of patches (0 or unset = derived) -- fix: set max_vision_cuda_graph_seq_length to the largest padded patch count, e.g. 784");
};

} // namespace capscope::rule_diagnostics
