#pragma once
//! @file
//! Normalization (spec §2.1 and the migration table of §3), in Megatron's order: legacy flags,
//! the deprecated `cuda_graph_scope` alias, the `full*` pseudo-modules, then the implementation
//! and inference-scope checks that see the migrated values.

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

namespace detail {
constexpr bool impl_set(const runtime_config& c) { return c.impl != graph_impl::eager || !c.unknown_impl.empty(); }
constexpr bool both_deprecated_modules(const runtime_config& c) {
    return c.modules.full_iteration && c.modules.full_iteration_inference;
}
constexpr bool inference_unset_or(const runtime_config& c, inference_scope s) {
    return !c.inference.has_value() || *c.inference == s;
}
constexpr void move_scope_into_modules(runtime_config& c) {
    c.modules = *c.deprecated_scope;
    // Assign an empty optional rather than reset(): nvcc's constant evaluator rejects copying an
    // optional whose payload was destroyed by reset().
    c.deprecated_scope = std::optional<module_request>{};
}
constexpr void drop_full_iteration(runtime_config& c) {
    c.impl = graph_impl::whole_iteration;
    c.modules.full_iteration = false;
    --c.modules.entries;
}
constexpr void drop_full_iteration_inference(runtime_config& c, bool to_block) {
    if (to_block) c.inference = inference_scope::per_block;
    c.modules.full_iteration_inference = false;
    --c.modules.entries;
}
constexpr bool inference_allowed(graph_impl impl, inference_scope s) {
    if (impl == graph_impl::lazy_per_layer) return s == inference_scope::per_layer || s == inference_scope::per_block;
    return s == inference_scope::eager;
}
} // namespace detail

CAPSCOPE_RULE(N1, error, normalization,
    "Legacy enable_cuda_graph/external_cuda_graph are not combined with cuda_graph_impl",
    "Do not use enable_cuda_graph or external_cuda_graph with cuda_graph_impl (legacy flag given together with an explicit implementation)",
    "drop --enable-cuda-graph/--external-cuda-graph (deprecated::enable_cuda_graph/external_cuda_graph) and keep only --cuda-graph-impl",
    nullptr,
    [](const runtime_config& c) { return (c.enable_cuda_graph || c.external_cuda_graph) && detail::impl_set(c); });

CAPSCOPE_RULE(N2, error, normalization,
    "At most one of the legacy flags enable_cuda_graph and external_cuda_graph",
    "enable_cuda_graph and external_cuda_graph cannot be enabled at the same time",
    "use --cuda-graph-impl local (impl::lazy_per_layer) or --cuda-graph-impl transformer_engine (impl::ahead_of_time_per_layer) instead of both legacy flags",
    nullptr,
    [](const runtime_config& c) { return c.enable_cuda_graph && c.external_cuda_graph; });

CAPSCOPE_RULE(N3, migration, normalization,
    "Legacy enable_cuda_graph migrates to cuda_graph_impl=local",
    "--enable-cuda-graph is deprecated; it becomes cuda_graph_impl=local",
    "write --cuda-graph-impl local (impl::lazy_per_layer)",
    [](runtime_config& c) { c.impl = graph_impl::lazy_per_layer; c.enable_cuda_graph = false; },
    [](const runtime_config& c) { return c.enable_cuda_graph && !c.external_cuda_graph && !detail::impl_set(c); });

CAPSCOPE_RULE(N3b, migration, normalization,
    "Legacy external_cuda_graph migrates to cuda_graph_impl=transformer_engine",
    "--external-cuda-graph is deprecated; it becomes cuda_graph_impl=transformer_engine",
    "write --cuda-graph-impl transformer_engine (impl::ahead_of_time_per_layer)",
    [](runtime_config& c) { c.impl = graph_impl::ahead_of_time_per_layer; c.external_cuda_graph = false; },
    [](const runtime_config& c) { return c.external_cuda_graph && !c.enable_cuda_graph && !detail::impl_set(c); });

CAPSCOPE_RULE(N4, error, normalization,
    "The deprecated cuda_graph_scope and cuda_graph_modules are not set together",
    "cuda_graph_scope and cuda_graph_modules cannot be set together",
    "move the --cuda-graph-scope values (deprecated::cuda_graph_scope<...>) into --cuda-graph-modules (modules<...>)",
    nullptr,
    [](const runtime_config& c) { return c.deprecated_scope.has_value() && !c.modules.empty(); });

CAPSCOPE_RULE(N4b, migration, normalization,
    "The deprecated cuda_graph_scope migrates to cuda_graph_modules",
    "--cuda-graph-scope is deprecated; its values become cuda_graph_modules",
    "write --cuda-graph-modules (modules<...>) instead of --cuda-graph-scope",
    detail::move_scope_into_modules,
    [](const runtime_config& c) { return c.deprecated_scope.has_value() && c.modules.empty(); });

CAPSCOPE_RULE(N5, error, normalization,
    "The deprecated module value full stands alone",
    "full scope cannot be used with other scopes",
    "drop 'full': an empty cuda_graph_modules (modules<>) already means the whole layer",
    nullptr,
    [](const runtime_config& c) { return c.modules.full && c.modules.entries > 1; });

CAPSCOPE_RULE(N5b, migration, normalization,
    "The deprecated module list [full] becomes [] (whole layer)",
    "cuda_graph_modules 'full' is deprecated; it becomes [] (capture the whole layer)",
    "leave --cuda-graph-modules empty (modules<>)",
    [](runtime_config& c) { c.modules = module_request{}; },
    [](const runtime_config& c) { return c.modules.full && c.modules.entries == 1; });

CAPSCOPE_RULE(N6, error, normalization,
    "Every cuda_graph_modules entry names a CUDA-graph module",
    "cuda_graph_modules entries must be strings or CudaGraphModule enums naming one of attn, mlp, moe, moe_router, moe_preprocess, mamba",
    "use only attn, mlp, moe, moe_router, moe_preprocess, mamba (capture::attention, capture::mlp, ...)",
    nullptr,
    [](const runtime_config& c) { return c.modules.non_module_entry || !c.modules.unknown_name.empty(); },
    [](const runtime_config& c) { return c.modules.unknown_name.view(); });

CAPSCOPE_RULE(N7, error, normalization,
    "At most one distinct deprecated value among cuda_graph_modules",
    "cuda_graph_modules cannot contain multiple deprecated values (full_iteration and full_iteration_inference) at the same time",
    "keep one: --cuda-graph-impl full_iteration for training, --inference-cuda-graph-scope block for inference",
    nullptr,
    detail::both_deprecated_modules);

CAPSCOPE_RULE(N8a, error, normalization,
    "The deprecated module full_iteration is not combined with cuda_graph_impl=transformer_engine",
    "cuda_graph_modules 'full_iteration' cannot be combined with cuda_graph_impl=transformer_engine",
    "use --cuda-graph-impl full_iteration (impl::whole_iteration) and drop 'full_iteration' from the modules",
    nullptr,
    [](const runtime_config& c) {
        return c.modules.full_iteration && !detail::both_deprecated_modules(c) && c.impl == graph_impl::ahead_of_time_per_layer;
    });

CAPSCOPE_RULE(N8b, error, normalization,
    "The deprecated module full_iteration is not combined with an inference scope layer or block",
    "cuda_graph_modules 'full_iteration' cannot be combined with inference_cuda_graph_scope=layer/block",
    "use --cuda-graph-impl full_iteration without --inference-cuda-graph-scope, or inference graphs with --cuda-graph-impl local",
    nullptr,
    [](const runtime_config& c) {
        return c.modules.full_iteration && !detail::both_deprecated_modules(c) && c.impl != graph_impl::ahead_of_time_per_layer &&
               !detail::inference_unset_or(c, inference_scope::eager);
    });

CAPSCOPE_RULE(N8c, migration, normalization,
    "The deprecated module full_iteration migrates to cuda_graph_impl=full_iteration",
    "cuda_graph_modules 'full_iteration' is deprecated; it becomes cuda_graph_impl=full_iteration (even when the impl was none)",
    "write --cuda-graph-impl full_iteration (impl::whole_iteration) with empty --cuda-graph-modules",
    detail::drop_full_iteration,
    [](const runtime_config& c) {
        return c.modules.full_iteration && !detail::both_deprecated_modules(c) && c.impl != graph_impl::ahead_of_time_per_layer &&
               c.unknown_impl.empty() && detail::inference_unset_or(c, inference_scope::eager);
    });

CAPSCOPE_RULE(N8d, error, normalization,
    "The deprecated module full_iteration_inference needs cuda_graph_impl local (or none)",
    "cuda_graph_modules 'full_iteration_inference' cannot be combined with cuda_graph_impl=transformer_engine or full_iteration",
    "use --cuda-graph-impl local --inference-cuda-graph-scope block (impl::lazy_per_layer, inference::per_block)",
    nullptr,
    [](const runtime_config& c) {
        return c.modules.full_iteration_inference && !detail::both_deprecated_modules(c) &&
               (c.impl == graph_impl::ahead_of_time_per_layer || c.impl == graph_impl::whole_iteration);
    });

CAPSCOPE_RULE(N8e, error, normalization,
    "The deprecated module full_iteration_inference needs the inference scope unset or block",
    "cuda_graph_modules 'full_iteration_inference' cannot be combined with inference_cuda_graph_scope=none/layer",
    "drop 'full_iteration_inference' and write --inference-cuda-graph-scope block (inference::per_block)",
    nullptr,
    [](const runtime_config& c) {
        return c.modules.full_iteration_inference && !detail::both_deprecated_modules(c) &&
               (c.impl == graph_impl::eager || c.impl == graph_impl::lazy_per_layer) &&
               !detail::inference_unset_or(c, inference_scope::per_block);
    });

CAPSCOPE_RULE(N8f, migration, normalization,
    "The deprecated module full_iteration_inference migrates to inference_cuda_graph_scope=block",
    "cuda_graph_modules 'full_iteration_inference' is deprecated; it becomes inference_cuda_graph_scope=block (other modules kept)",
    "write --inference-cuda-graph-scope block (inference::per_block)",
    [](runtime_config& c) { detail::drop_full_iteration_inference(c, true); },
    [](const runtime_config& c) {
        return c.modules.full_iteration_inference && !detail::both_deprecated_modules(c) &&
               c.impl == graph_impl::lazy_per_layer && detail::inference_unset_or(c, inference_scope::per_block);
    });

CAPSCOPE_RULE(N8g, migration, normalization,
    "The deprecated module full_iteration_inference has no effect with cuda_graph_impl=none",
    "cuda_graph_modules 'full_iteration_inference' has no effect when cuda_graph_impl='none'; it is dropped",
    "drop 'full_iteration_inference', or set --cuda-graph-impl local --inference-cuda-graph-scope block",
    [](runtime_config& c) { detail::drop_full_iteration_inference(c, false); },
    [](const runtime_config& c) {
        return c.modules.full_iteration_inference && !detail::both_deprecated_modules(c) &&
               c.impl == graph_impl::eager && c.unknown_impl.empty() && detail::inference_unset_or(c, inference_scope::per_block);
    });

CAPSCOPE_RULE(N9, error, normalization,
    "cuda_graph_impl is one of none, local, transformer_engine, full_iteration",
    "Invalid cuda graph implementation",
    "use none, local, transformer_engine or full_iteration (impl::eager, impl::lazy_per_layer, impl::ahead_of_time_per_layer, impl::whole_iteration)",
    nullptr,
    [](const runtime_config& c) { return !c.unknown_impl.empty(); },
    [](const runtime_config& c) { return c.unknown_impl.view(); });

CAPSCOPE_RULE(N10, default_value, normalization,
    "An unset inference_cuda_graph_scope is layer for cuda_graph_impl=local, none otherwise",
    "inference_cuda_graph_scope is derived from cuda_graph_impl",
    "set --inference-cuda-graph-scope to choose",
    [](runtime_config& c) { c.inference = c.impl == graph_impl::lazy_per_layer ? inference_scope::per_layer : inference_scope::eager; },
    [](const runtime_config& c) { return !c.inference.has_value(); });

CAPSCOPE_RULE(N11, error, normalization,
    "The inference scope is allowed for the impl: none->{none}, local->{layer,block}, transformer_engine->{none}, full_iteration->{none}",
    "Invalid inference CUDA graph scope for this cuda_graph_impl (none, transformer_engine and full_iteration allow only none; local allows layer or block)",
    "use --cuda-graph-impl local (impl::lazy_per_layer) for inference graphs, or drop --inference-cuda-graph-scope",
    nullptr,
    [](const runtime_config& c) { return c.inference.has_value() && !detail::inference_allowed(c.impl, *c.inference); });

// N12 only checks two values that are already final, so it is a capture-scope error: the
// rules after it still run (Megatron's validate_args checks A1, A3, A6 and O10 before it).
CAPSCOPE_RULE(N12, error, capture_scope,
    "cuda_graph_modules is empty when cuda_graph_impl=full_iteration",
    "cuda_graph_modules must be empty when cuda_graph_impl=\"full_iteration\"",
    "drop --cuda-graph-modules (modules<...>): the whole iteration is one graph",
    nullptr,
    [](const runtime_config& c) { return c.impl == graph_impl::whole_iteration && !c.modules.modules.empty(); });

} // namespace capscope::rules
