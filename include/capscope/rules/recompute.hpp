#pragma once
//! @file
//! Recompute rules (spec §2.2, R1–R5; R0 from TransformerConfig's own check of the names): a recompute region lies wholly inside or wholly outside
//! a graph, and graphed recompute cannot draw fresh random numbers.

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

CAPSCOPE_RULE(R0, error, recompute,
    "Selective recompute names Megatron's recompute modules",
    "Invalid choices for recompute_modules (TransformerConfig allows core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts)",
    "pass --recompute-modules with valid names (recompute<granularity, recompute_module::...>)",
    nullptr,
    [](const runtime_config& c) { return c.selective_recompute() && !c.unknown_recompute_module.empty(); },
    [](const runtime_config& c) { return c.unknown_recompute_module.view(); });

CAPSCOPE_RULE(R1, error, recompute,
    "Full recompute only with cuda_graph_impl=full_iteration",
    "full recompute is only supported with full iteration CUDA graph",
    "use --recompute-granularity selective, or --cuda-graph-impl full_iteration (impl::whole_iteration)",
    nullptr,
    [](const runtime_config& c) {
        return c.impl != graph_impl::eager && c.impl != graph_impl::whole_iteration &&
               c.recompute == recompute_granularity::full;
    });

CAPSCOPE_RULE(R2, error, recompute,
    "No moe recompute with a transformer_engine moe_router graph",
    "moe recompute is not supported with moe_router CUDA graph when cuda_graph_impl=transformer_engine",
    "drop moe from --recompute-modules, or moe_router from the modules",
    nullptr,
    [](const runtime_config& c) {
        return c.impl == graph_impl::ahead_of_time_per_layer && c.recomputes(recompute_module::moe) &&
               c.captures(capture_module::moe_router);
    });

CAPSCOPE_RULE(R3, error, recompute,
    "No graphed attention recompute with attention dropout",
    "attention dropout is not supported with graphed attention recomputation (core_attn recomputed inside a graph while --attention-dropout != 0)",
    "set --attention-dropout 0, drop core_attn from --recompute-modules, or capture modules that exclude attn",
    nullptr,
    [](const runtime_config& c) {
        return c.impl != graph_impl::eager && c.attention_dropout != 0.0 && c.recomputes(recompute_module::core_attn) &&
               (c.full_cudagraph() || c.captures(capture_module::attention));
    });

CAPSCOPE_RULE(R4, error, recompute,
    "No graphed MLP/MoE recompute with hidden dropout",
    "hidden dropout is not supported with graphed MLP/MoE recomputation (mlp or moe recomputed inside a graph while --hidden-dropout != 0)",
    "set --hidden-dropout 0, drop mlp/moe from --recompute-modules, or stop capturing that region",
    nullptr,
    [](const runtime_config& c) {
        if (c.impl == graph_impl::eager || c.hidden_dropout == 0.0) return false;
        bool mlp = c.recomputes(recompute_module::mlp) && (c.full_cudagraph() || c.captures(capture_module::mlp));
        bool moe = c.recomputes(recompute_module::moe) && (c.full_cudagraph() || c.captures(capture_module::moe));
        return mlp || moe;
    });

CAPSCOPE_RULE(R5, error, recompute,
    "No graphed moe recompute with MoE input jitter",
    "moe_input_jitter_eps is not supported with graphed moe recomputation",
    "unset --moe-input-jitter-eps, drop moe from --recompute-modules, or stop capturing moe",
    nullptr,
    [](const runtime_config& c) {
        return c.impl != graph_impl::eager && c.input_jitter_eps.has_value() && c.recomputes(recompute_module::moe) &&
               (c.full_cudagraph() || c.captures(capture_module::moe));
    });

} // namespace capscope::rules
