#pragma once
//! @file
//! Capture-scope rules (spec §2.2, S0–S7): which per-layer regions make sense for the model.

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

namespace detail {
constexpr bool per_layer_captures(const runtime_config& c, capture_module m) {
    return is_per_layer(c.impl) && c.captures(m);
}
constexpr bool complete_router_pair_needed(const runtime_config& c) {
    return c.impl == graph_impl::lazy_per_layer &&
           c.captures(capture_module::moe_router) != c.captures(capture_module::moe_preprocess);
}
constexpr void complete_router_pair(runtime_config& c) {
    c.modules.modules.insert(capture_module::moe_router);
    c.modules.modules.insert(capture_module::moe_preprocess);
}
} // namespace detail

CAPSCOPE_RULE(S0, error, capture_scope,
    "Layer-level CPU offloading only with cuda_graph_impl=full_iteration (or no graphs)",
    "CUDA graphs not supported with CPU offloading (--cpu-offloading-num-layers > 0)",
    "set --cpu-offloading-num-layers 0, or use --cuda-graph-impl full_iteration (impl::whole_iteration)",
    nullptr,
    [](const runtime_config& c) {
        return c.impl != graph_impl::eager && c.impl != graph_impl::whole_iteration && c.cpu_offloading();
    });

CAPSCOPE_RULE(S1, adjustment, capture_scope,
    "With cuda_graph_impl=local, moe_router and moe_preprocess are captured together",
    "cuda_graph_impl=local does not distinguish moe_router from moe_preprocess; Megatron adds the missing one",
    "list both moe_router and moe_preprocess (capture::moe_router, capture::moe_preprocess)",
    detail::complete_router_pair,
    detail::complete_router_pair_needed);

CAPSCOPE_RULE(S2, error, capture_scope,
    "moe and moe_router are never captured together",
    "cuda_graph_modules must not contain both moe and moe_router",
    "capture either moe (the whole MoE block, drop-and-pad only) or moe_router [+ moe_preprocess]",
    nullptr,
    [](const runtime_config& c) {
        return detail::per_layer_captures(c, capture_module::moe) && c.captures(capture_module::moe_router);
    });

CAPSCOPE_RULE(S3, error, capture_scope,
    "moe_preprocess is captured only together with moe_router",
    "moe_preprocess cuda graph is only supported with moe_router cuda graph",
    "add moe_router (capture::moe_router) or drop moe_preprocess",
    nullptr,
    [](const runtime_config& c) {
        return detail::per_layer_captures(c, capture_module::moe_preprocess) && !c.captures(capture_module::moe_router);
    });

CAPSCOPE_RULE(S4, error, capture_scope,
    "moe and moe_router are captured only in MoE models",
    "moe cuda graph is only supported for MoE (the model has no experts: --num-experts unset or <= 1)",
    "drop moe/moe_router/moe_preprocess from the modules, or give the model experts (--num-experts > 1)",
    nullptr,
    [](const runtime_config& c) {
        return is_per_layer(c.impl) && !c.is_moe() &&
               (c.captures(capture_module::moe) || c.captures(capture_module::moe_router));
    });

CAPSCOPE_RULE(S5, error, capture_scope,
    "mlp is captured only when the model has dense layers",
    "mlp cuda graph is only supported for dense layers, and every layer of this MoE model is an MoE layer",
    "drop mlp from the modules, or capture moe/moe_router for the MoE layers",
    nullptr,
    [](const runtime_config& c) {
        return detail::per_layer_captures(c, capture_module::mlp) && c.is_moe() && !c.has_dense_layers();
    });

CAPSCOPE_RULE(S6, error, capture_scope,
    "moe is captured only for drop-and-pad MoE",
    "moe cuda graph is only supported with drop-padding MoE (needs --moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity)",
    "capture moe_router [+ moe_preprocess] instead of moe, or make the MoE drop-and-pad (in capscope's engine, static_expert_capacity keeps it dropless, a step past the capacity rerun eagerly)",
    nullptr,
    [](const runtime_config& c) {
        return detail::per_layer_captures(c, capture_module::moe) && c.is_moe() && !c.drop_and_pad() && !c.static_expert_capacity;
    });

CAPSCOPE_RULE(S7, error, capture_scope,
    "moe_preprocess is not captured when the alltoall preprocess syncs device to host",
    "moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the preprocess step (alltoall dispatcher with a capacity factor or fp8 router padding, not drop-and-pad)",
    "drop moe_preprocess (capture moe_router only), or make the MoE drop-and-pad",
    nullptr,
    [](const runtime_config& c) {
        return detail::per_layer_captures(c, capture_module::moe_preprocess) && c.is_moe() && !c.drop_and_pad() &&
               c.dispatcher == token_dispatcher::alltoall &&
               (c.expert_capacity_factor.has_value() || c.router_padding_for_fp8);
    });

} // namespace capscope::rules
