#pragma once
//! @file
//! Vision-encoder graphs (spec §6, Megatron-Bridge): the encoder has its own impl and modules,
//! never inherited from the language model, and pads to a fixed length.

#include <capscope/rules/rule.hpp>

namespace capscope::rules {

namespace detail {
inline constexpr capture_module_set vision_capturable{capture_module::attention, capture_module::mlp};
}

CAPSCOPE_RULE(V1, error, vision,
    "The vision encoder captures with transformer_engine or not at all",
    "vision_cuda_graph_impl must be none or transformer_engine (only transformer_engine captures vision layers)",
    "set vision_cuda_graph_impl to transformer_engine (vision<impl::ahead_of_time_per_layer, ...>) or none",
    nullptr,
    [](const runtime_config& c) {
        return !c.vision.unknown_impl.empty() ||
               (c.vision.impl != graph_impl::eager && c.vision.impl != graph_impl::ahead_of_time_per_layer);
    },
    [](const runtime_config& c) { return c.vision.unknown_impl.view(); });

CAPSCOPE_RULE(V2, error, vision,
    "Vision capture modules are attn and mlp only",
    "vision_cuda_graph_scope may list only attn and mlp (the vision encoder has dense transformer layers only)",
    "list attn and/or mlp, or nothing for whole layers",
    nullptr,
    [](const runtime_config& c) {
        return !c.vision.unknown_module.empty() || !c.vision.modules.subset_of(detail::vision_capturable);
    },
    [](const runtime_config& c) { return c.vision.unknown_module.view(); });

CAPSCOPE_RULE(V3, error, vision,
    "The fixed vision sequence length is not negative",
    "max_vision_cuda_graph_seq_length must be a positive number of patches (0 or unset = derived)",
    "set max_vision_cuda_graph_seq_length to the largest padded patch count, e.g. 784",
    nullptr,
    [](const runtime_config& c) { return c.vision.max_seq_length.has_value() && *c.vision.max_seq_length < 0; });

CAPSCOPE_RULE(V4, migration, vision,
    "Vision modules without a vision impl are ignored",
    "vision_cuda_graph_scope is ignored because vision_cuda_graph_impl is none (the language model's settings are never inherited)",
    "drop vision_cuda_graph_scope, or set vision_cuda_graph_impl transformer_engine",
    [](runtime_config& c) { c.vision.modules = capture_module_set{}; },
    [](const runtime_config& c) { return c.vision.impl == graph_impl::eager && !c.vision.modules.empty(); });

CAPSCOPE_RULE(V5, migration, vision,
    "An unset vision sequence length is derived",
    "max_vision_cuda_graph_seq_length unset (or 0): Megatron uses num_position_embeddings // spatial_merge_size^2, else 4096",
    "set max_vision_cuda_graph_seq_length to pad to a length you chose",
    [](runtime_config& c) { c.vision.max_seq_length = std::optional<int>{}; },
    [](const runtime_config& c) {
        return c.vision.impl == graph_impl::ahead_of_time_per_layer &&
               (!c.vision.max_seq_length.has_value() || *c.vision.max_seq_length == 0) &&
               c.vision.unknown_impl.empty();
    });

} // namespace capscope::rules
