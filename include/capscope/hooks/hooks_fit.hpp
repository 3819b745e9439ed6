#pragma once
//! @file
//! Whether a hook pipeline fits a configuration's capture scope, checked where the pair is named:
//! `static_assert(hooks_fit<Config, decltype(pipeline)>)`.
//!
//! H2: under `impl::whole_iteration` the step is one graph, so no boundary exists for a boundary
//! hook's host work. (A boundary hook of a region inside a fused per-layer segment splits that
//! segment at the hook; the plan shows where.)

#include <capscope/config/config.hpp>
#include <capscope/hooks/hook_pipeline.hpp>

namespace capscope {

namespace detail {
template <class Config, class Pipeline>
struct checked_hooks {
    static_assert(!(Config::impl == graph_impl::whole_iteration && Pipeline::has_boundary_hooks),
                  "capscope hook rule H2: impl::whole_iteration captures the whole step as one graph, so a boundary hook "
                  "has no boundary to run its host work at -- fix: make the hook capturable (stream work only), or use a "
                  "per-layer impl (impl::lazy_per_layer, impl::ahead_of_time_per_layer)");
    static constexpr bool value = true;
};
} // namespace detail

template <class Config, class Pipeline>
inline constexpr bool hooks_fit = detail::checked_hooks<Config, Pipeline>::value;

} // namespace capscope
