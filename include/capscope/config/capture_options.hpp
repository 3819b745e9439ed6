#pragma once
//! @file
//! Capture options: the implementation, the per-layer modules, the inference scope, warmup
//! steps, and the deprecated spellings Megatron still migrates.
//!
//! @code
//! config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>>
//! @endcode

#include <capscope/config/option.hpp>
#include <capscope/detail/short_text.hpp>

namespace capscope {

// --- implementation -------------------------------------------------------------------
namespace impl {
template <graph_impl I>
struct choice {
    using option_kind = option_kind::impl;
    static constexpr graph_impl value = I;
    static constexpr void apply(runtime_config& c) { c.impl = I; }
    static constexpr void apply_vision(vision_settings& v) { v.impl = I; }
};
using eager = choice<graph_impl::eager>;                                     //!< Megatron `none`
using lazy_per_layer = choice<graph_impl::lazy_per_layer>;                   //!< Megatron `local`
using ahead_of_time_per_layer = choice<graph_impl::ahead_of_time_per_layer>; //!< Megatron `transformer_engine`
using whole_iteration = choice<graph_impl::whole_iteration>;                 //!< Megatron `full_iteration`
} // namespace impl

//! An implementation named by its Megatron spelling, e.g. `impl_named<"local">`.
template <detail::fixed_string Name>
struct impl_named {
    using option_kind = option_kind::impl;
    static constexpr void apply(runtime_config& c) {
        if (auto i = parse_megatron_name<graph_impl>(Name.view())) c.impl = *i;
        else c.unknown_impl = detail::unknown_name(Name.view());
    }
    static constexpr void apply_vision(vision_settings& v) {
        if (auto i = parse_megatron_name<graph_impl>(Name.view())) v.impl = *i;
        else v.unknown_impl = detail::unknown_name(Name.view());
    }
};

// --- modules ----------------------------------------------------------------------------
namespace capture {
template <capture_module M>
struct module {
    static constexpr void add_to(module_request& r) { r.modules.insert(M); }
};
using attention = module<capture_module::attention>;
using mlp = module<capture_module::mlp>;
using moe = module<capture_module::moe>;
using moe_router = module<capture_module::moe_router>;
using moe_preprocess = module<capture_module::moe_preprocess>;
using mamba = module<capture_module::mamba>;
} // namespace capture

namespace deprecated {
//! `"full"`: whole layer; write `modules<>` instead.
struct full { static constexpr void add_to(module_request& r) { r.full = true; } };
//! `"full_iteration"`: write `impl::whole_iteration` instead.
struct full_iteration { static constexpr void add_to(module_request& r) { r.full_iteration = true; } };
//! `"full_iteration_inference"`: write `inference::per_block` instead.
struct full_iteration_inference { static constexpr void add_to(module_request& r) { r.full_iteration_inference = true; } };
} // namespace deprecated

//! A module named by its Megatron spelling, e.g. `module_named<"attn">`; the deprecated
//! spellings `full`, `full_iteration`, `full_iteration_inference` are accepted too.
template <detail::fixed_string Name>
struct module_named {
    static constexpr void add_to(module_request& r) { add_module_name(r, Name.view()); }
};

namespace detail {
template <class M>
concept module_entry = requires(module_request& r) { M::add_to(r); };

template <class... Ms>
constexpr module_request make_module_request() {
    module_request r;
    auto add = [&]<class M>() {
        if constexpr (module_entry<M>) M::add_to(r);
        else r.non_module_entry = true; // rule N6 names it
        ++r.entries;
    };
    (void)add; // an empty list uses it not at all
    (add.template operator()<Ms>(), ...);
    return r;
}
} // namespace detail

//! `cuda_graph_modules`: the per-layer capture regions; `modules<>` = the whole layer.
template <class... Ms>
struct modules {
    using option_kind = option_kind::modules;
    static constexpr module_request request = detail::make_module_request<Ms...>();
    static constexpr void apply(runtime_config& c) { c.modules = request; }
};

namespace deprecated {
//! `--enable-cuda-graph`: write `impl::lazy_per_layer`.
struct enable_cuda_graph {
    using option_kind = option_kind::enable_cuda_graph;
    static constexpr void apply(runtime_config& c) { c.enable_cuda_graph = true; }
};
//! `--external-cuda-graph`: write `impl::ahead_of_time_per_layer`.
struct external_cuda_graph {
    using option_kind = option_kind::external_cuda_graph;
    static constexpr void apply(runtime_config& c) { c.external_cuda_graph = true; }
};
//! `--cuda-graph-scope …`: write `modules<…>`.
template <class... Ms>
struct cuda_graph_scope {
    using option_kind = option_kind::deprecated_scope;
    static constexpr void apply(runtime_config& c) { c.deprecated_scope = detail::make_module_request<Ms...>(); }
};
} // namespace deprecated

// --- inference scope and warmup ------------------------------------------------------------
namespace inference {
template <inference_scope S>
struct choice {
    using option_kind = option_kind::inference;
    static constexpr void apply(runtime_config& c) { c.inference = S; }
};
using eager = choice<inference_scope::eager>;         //!< Megatron `none`
using per_layer = choice<inference_scope::per_layer>; //!< Megatron `layer`
using per_block = choice<inference_scope::per_block>; //!< Megatron `block`
} // namespace inference

//! `--cuda-graph-warmup-steps` (Megatron's default is 3).
template <int N>
struct warmup_steps {
    using option_kind = option_kind::warmup;
    static constexpr void apply(runtime_config& c) { c.warmup_steps = N; }
};

} // namespace capscope
