#pragma once
//! @file
//! Layer schemas: a layer kind's stages declared as a type, so that a plan can be computed, and
//! checked, by the compiler.
//!
//! @code
//! using moe_layer = layer_schema<"moe",
//!     stage_decl<stage_kind::attention, regions<capture::attention>>,
//!     stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>>,
//!     stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, synchronizes_with_host>,
//!     stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
//! @endcode
//! `layer_plan<Config, moe_layer>` (capscope/plan/layer_plan.hpp) is then a constant; a config
//! that captures a stage that cannot be captured fails to compile, naming the stage and the fix.
//! At bind time the runner checks that the model's stages match one of its schemas
//! (`match_schemas`).

#include <capscope/config/capture_options.hpp>
#include <capscope/detail/short_text.hpp>
#include <capscope/stage/stage.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace capscope {

//! The capture regions (Megatron's module values) that contain a stage.
template <class... Modules>
struct regions {
    static_assert((detail::module_entry<Modules> && ...),
                  "capscope::regions<...> takes capture modules: capture::attention, capture::mlp, capture::moe, "
                  "capture::moe_router, capture::moe_preprocess, capture::mamba");
    static constexpr capture_module_set set = detail::make_module_request<Modules...>().modules;
};

//! Stage properties that keep a stage out of graphs.
struct synchronizes_with_host {
    static constexpr void apply(stage_facts& f) { f.synchronizes_with_host = true; }
};
struct shapes_depend_on_data {
    static constexpr void apply(stage_facts& f) { f.shapes_depend_on_data = true; }
};
struct passes_host_values {
    static constexpr void apply(stage_facts& f) { f.passes_host_values = true; }
};
//! The stage runs on the runner's side stream `Lane` (capscope/stage/stage.hpp).
template <int Lane>
struct on_lane {
    static_assert(Lane >= 1 && Lane <= max_lanes, "capscope::on_lane<k>: lanes are numbered 1..capscope::max_lanes (0 is the step's stream)");
    static constexpr void apply(stage_facts& f) { f.lane = Lane; }
};
//! Before the stage, wait for the work issued on lane `Lane` so far.
template <int Lane>
struct waits_for_lane {
    static_assert(Lane >= 1 && Lane <= max_lanes, "capscope::waits_for_lane<k>: lanes are numbered 1..capscope::max_lanes");
    static constexpr void apply(stage_facts& f) { f.waits_for |= std::uint32_t{1} << Lane; }
};

namespace detail {
template <class P>
concept stage_property = requires(stage_facts& f) { P::apply(f); };
template <class R>
inline constexpr bool is_regions = false;
template <class... Ms>
inline constexpr bool is_regions<regions<Ms...>> = true;
} // namespace detail

//! One stage of a layer schema: its kind, the regions that contain it, its properties.
template <stage_kind Kind, class Regions = regions<>, class... Properties>
struct stage_decl {
    static_assert(detail::is_regions<Regions>, "capscope::stage_decl<kind, regions<...>, properties...>: the second argument is regions<...>");
    static_assert((detail::stage_property<Properties> && ...),
                  "capscope::stage_decl<...> properties are synchronizes_with_host, shapes_depend_on_data, passes_host_values, "
                  "on_lane<k> and waits_for_lane<k>");
    static constexpr stage_facts facts(int layer) {
        stage_facts f{Kind, layer, Regions::set};
        (Properties::apply(f), ...);
        return f;
    }
};

namespace detail {
template <class T>
inline constexpr bool is_stage_decl = false;
template <stage_kind K, class R, class... Ps>
inline constexpr bool is_stage_decl<stage_decl<K, R, Ps...>> = true;
} // namespace detail

//! A layer kind: its name and its stages in forward order.
template <detail::fixed_string Name, class... Stages>
struct layer_schema {
    static_assert(sizeof...(Stages) > 0, "capscope::layer_schema<name, stages...> needs at least one stage_decl");
    static_assert((detail::is_stage_decl<Stages> && ...), "capscope::layer_schema<name, ...> takes stage_decl<...> types");
    static constexpr std::string_view name() { return Name.view(); }
    static constexpr std::size_t size = sizeof...(Stages);
    //! The stages' facts, as layer `layer` of a model.
    static constexpr std::array<stage_facts, size> facts(int layer = 0) { return {Stages::facts(layer)...}; }
};

//! The layer kinds a model is made of, for the bind-time check.
template <class... Layers>
struct layer_schemas {
    static constexpr std::size_t size = sizeof...(Layers);
};

} // namespace capscope
