#pragma once
//! @file
//! Fine-grained activation offloading: general rules (spec §4.2, O1–O7, O10), offloading x CUDA
//! graphs (§4.3, OC1–OC6) and the norms that sit on a graph boundary (§4.4, OB1–OB2).
//!
//! These are Megatron's rules about Megatron's module names. A trainer's own offload names
//! (`offload_tensors<"...">`) are moved by capscope's engine, not Megatron's: the rules about
//! Megatron's offload engine (O1, O10, OC1–OC4, OC6) pass over a policy that names only a
//! trainer's own tensors; O2 (a non-empty list, no unknown name), O6 (sizes and the fraction)
//! and OC5 (a warmup step) hold for every policy. Plan rule P11 checks where any offloaded tensor's copies go.

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

namespace detail {
constexpr bool offloading(const runtime_config& c) { return c.offload.enabled; }
constexpr bool offloading_with_graphs(const runtime_config& c) { return c.offload.enabled && c.impl != graph_impl::eager; }
//! Megatron's offload engine is asked for: a Megatron name is offloaded (or none is named, O2).
constexpr bool offloading_megatron(const runtime_config& c) {
    return c.offload.enabled && (c.offload.modules.empty() || !c.offload.modules.megatron().empty());
}
constexpr bool offloading_megatron_with_graphs(const runtime_config& c) { return offloading_megatron(c) && c.impl != graph_impl::eager; }
constexpr bool local_partial_moe_offload(const runtime_config& c) {
    const offload_name_set megatron = c.offload.modules.megatron();
    return c.impl == graph_impl::lazy_per_layer && !megatron.empty() && megatron.subset_of(moe_expert_offloads) &&
           !c.captures(capture_module::moe);
}
//! mlp_norm's input crosses a graph boundary on some layer kind of this model (§4.4).
constexpr bool mlp_norm_on_boundary(const runtime_config& c) {
    bool attn = c.captures(capture_module::attention);
    bool on_moe = c.has_moe_layers() && (attn || c.captures(capture_module::moe_router));
    bool on_dense = c.has_dense_layers() && (attn != c.captures(capture_module::mlp));
    return on_moe || on_dense;
}
} // namespace detail

CAPSCOPE_RULE(O10, error, offload,
    "Fine-grained activation offloading runs on the transformer_engine implementation",
    "fine-grained activation offloading is only supported with --transformer-impl transformer_engine",
    "use --transformer-impl transformer_engine (transformer<transformer_impl::transformer_engine>), or drop --fine-grained-activation-offloading",
    nullptr,
    [](const runtime_config& c) { return detail::offloading_megatron(c) && c.transformer != transformer_impl::transformer_engine; });

CAPSCOPE_RULE(O1, error, offload,
    "Fine-grained activation offloading is not combined with layer-level CPU offloading",
    "fine-grained activation offloading cannot be combined with layer-level CPU offloading (--cpu-offloading-num-layers > 0)",
    "choose one: drop --fine-grained-activation-offloading or set --cpu-offloading-num-layers 0",
    nullptr,
    [](const runtime_config& c) { return detail::offloading_megatron(c) && c.cpu_offloading(); });

CAPSCOPE_RULE(O2, error, offload,
    "offload_modules is non-empty and names only offloadable modules",
    "Invalid choices for offload_modules: it must be non-empty and list only attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp, gdp_qkv",
    "pass --offload-modules with valid names (offload_modules<offload_module::...>)",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading(c) && (c.offload.modules.empty() || !c.offload.unknown_module.empty());
    },
    [](const runtime_config& c) { return c.offload.unknown_module.view(); });

CAPSCOPE_RULE(O3, error, offload,
    "attn_proj is offloaded only together with core_attn",
    "offloading attn_proj requires offloading core_attn",
    "add core_attn to --offload-modules or drop attn_proj",
    nullptr,
    [](const runtime_config& c) {
        return c.offloads(offload_module::attn_proj) && !c.offloads(offload_module::core_attn);
    });

CAPSCOPE_RULE(O5, error, offload,
    "MoE expert inputs are not offloaded when moe is recomputed",
    "selective recompute of moe cannot be combined with offloading moe_act, expert_fc1 or fused_group_mlp",
    "drop moe from --recompute-modules, or the expert modules from --offload-modules",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading(c) && c.recomputes(recompute_module::moe) &&
               c.offload.modules.intersects(moe_expert_offloads);
    });

CAPSCOPE_RULE(O6, error, offload,
    "Offload sizes are non-negative and the fraction lies in [0, 1]",
    "min_offloaded_tensor_size and delta_offload_bytes_across_pp_ranks must be >= 0 and activation_offload_fraction in [0, 1]",
    "fix --min-offloaded-tensor-size, --delta-offload-bytes-across-pp-ranks or --activation-offload-fraction",
    nullptr,
    [](const runtime_config& c) {
        const auto& o = c.offload;
        return detail::offloading(c) &&
               (o.min_tensor_size < 0 || o.delta_bytes_across_pp_ranks < 0 || !(o.fraction >= 0.0 && o.fraction <= 1.0));
    });

CAPSCOPE_RULE(O7, error, offload,
    "fused_group_mlp offload needs the TE op fuser and excludes expert_fc1/moe_act",
    "offloading fused_group_mlp requires --use-transformer-engine-op-fuser and cannot be combined with expert_fc1 or moe_act",
    "enable --use-transformer-engine-op-fuser and offload fused_group_mlp alone among the expert modules",
    nullptr,
    [](const runtime_config& c) {
        return c.offloads(offload_module::fused_group_mlp) &&
               (!c.te_op_fuser || c.offloads(offload_module::expert_fc1) || c.offloads(offload_module::moe_act));
    });

CAPSCOPE_RULE(OC1, error, offload,
    "With cuda_graph_impl=local only MoE expert inputs are offloaded",
    "fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules 'expert_fc1', 'moe_act', and 'fused_group_mlp'",
    "offload only expert_fc1/moe_act/fused_group_mlp, or use --cuda-graph-impl transformer_engine",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading_megatron_with_graphs(c) && c.impl == graph_impl::lazy_per_layer &&
               !c.offload.modules.megatron().subset_of(moe_expert_offloads);
    });

CAPSCOPE_RULE(OC2, error, offload,
    "With cuda_graph_impl=local, offloading is not combined with whole-layer capture",
    "fine-grained activation offloading with cuda_graph_impl='local' is not supported with whole-layer CUDA graph capture (empty cuda_graph_modules)",
    "list the captured modules explicitly, e.g. --cuda-graph-modules attn moe_router moe_preprocess",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading_megatron_with_graphs(c) && c.impl == graph_impl::lazy_per_layer && c.captures_whole_layers();
    });

CAPSCOPE_RULE(OC3, error, offload,
    "Offloading with graphs needs transformer_engine, full_iteration, or local partial MoE offload",
    "fine-grained activation offloading is only supported with cuda_graph_impl transformer_engine or full_iteration, or local with partial MoE offload",
    "use --cuda-graph-impl transformer_engine or full_iteration, or with local offload only MoE expert inputs without capturing moe",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading_megatron_with_graphs(c) && c.impl != graph_impl::ahead_of_time_per_layer &&
               c.impl != graph_impl::whole_iteration && !detail::local_partial_moe_offload(c);
    });

CAPSCOPE_RULE(OC4, error, offload,
    "Offloading with graphs does not capture moe",
    "Token-drop MoE is temporarily not supported with activation offloading (moe is captured)",
    "capture moe_router [+ moe_preprocess] instead of moe",
    nullptr,
    [](const runtime_config& c) { return detail::offloading_megatron_with_graphs(c) && c.captures(capture_module::moe); });

CAPSCOPE_RULE(OC5, error, offload,
    "Offloading with graphs needs at least one warmup step",
    "cuda_graph_warmup_steps must be greater than 0 when fine-grained activation offloading is used with CUDA graphs",
    "set --cuda-graph-warmup-steps 1 or more (warmup_steps<N>)",
    nullptr,
    [](const runtime_config& c) { return detail::offloading_with_graphs(c) && c.warmup_steps <= 0; });

CAPSCOPE_RULE(OC6, error, offload,
    "Offloading inside a full-iteration graph caps in-flight offloads",
    "fine_grained_offloading_max_inflight_offloads must be a non-negative integer with full-iteration CUDA graphs",
    "set --fine-grained-offloading-max-inflight-offloads N with N >= 0 (max_inflight_offloads<N>)",
    nullptr,
    [](const runtime_config& c) {
        return detail::offloading_megatron_with_graphs(c) && c.impl == graph_impl::whole_iteration &&
               (!c.offload.max_inflight.has_value() || *c.offload.max_inflight < 0);
    });

CAPSCOPE_RULE(OB1, adjustment, offload,
    "attn_norm is not offloaded when attn is captured (its input crosses the graph boundary)",
    "attn_norm's input crosses the attn graph boundary; Megatron silently disables its offload",
    "drop attn_norm from the offload modules",
    [](runtime_config& c) { c.offload.modules.erase(offload_module::attn_norm); },
    [](const runtime_config& c) {
        return is_per_layer(c.impl) && c.offloads(offload_module::attn_norm) && c.captures(capture_module::attention);
    });

CAPSCOPE_RULE(OB2, adjustment, offload,
    "mlp_norm is not offloaded when its input crosses a graph boundary",
    "mlp_norm's input crosses a graph boundary (MoE layer with attn or moe_router captured, or dense layer with exactly one of attn/mlp); Megatron silently disables its offload there",
    "drop mlp_norm from the offload modules, or capture both attn and mlp",
    [](runtime_config& c) { c.offload.modules.erase(offload_module::mlp_norm); },
    [](const runtime_config& c) {
        return is_per_layer(c.impl) && c.offloads(offload_module::mlp_norm) && !c.modules.modules.empty() &&
               detail::mlp_norm_on_boundary(c);
    });

} // namespace capscope::rules
