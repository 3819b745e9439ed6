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
//!
//! Kinds and regions are open: a trainer's own layer is declared the same way, with names of
//! its own (`stage_decl<"mixer", regions<region<"mixer">>>`), and a `make()` builds its stage.

#include <capscope/config/capture_options.hpp>
#include <capscope/detail/short_text.hpp>
#include <capscope/stage/stage.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <concepts>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace capscope {

namespace detail {
template <class R>
concept own_region = requires { { R::name } -> std::convertible_to<std::string_view>; };
template <class R>
constexpr void add_region(region_set& s) {
    if constexpr (own_region<R>) s.insert(R::name);
    else s.insert_all(make_module_request<R>().modules);
}
} // namespace detail

namespace detail {
template <class... Regions>
struct region_list {
    static constexpr region_set set = [] {
        region_set s;
        (detail::add_region<Regions>(s), ...);
        return s;
    }();
};
template <class... Regions>
struct checked_regions {
    static_assert(((module_entry<Regions> || own_region<Regions>) && ...),
                  "capscope schema rule: regions<...> takes capture modules (capture::attention, capture::mlp, capture::moe, "
                  "capture::moe_router, capture::moe_preprocess, capture::mamba) or a trainer's own regions -- fix: write "
                  "capscope::region<\"name\"> for a region of your own");
    using type = region_list<Regions...>;
};
} // namespace detail

//! The capture regions that contain a stage: Megatron's modules (`capture::attention`, ...) or
//! a trainer's own (`region<"mixer">`). Checked where it is named.
template <class... Regions>
using regions = typename detail::checked_regions<Regions...>::type;

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
//! Passes host values, and is captured anyway: recorded again and updated in the executable graph
//! before each replay (stage_facts::updated_in_graph).
struct updated_in_graph {
    static constexpr void apply(stage_facts& f) { f.passes_host_values = f.updated_in_graph = true; }
};
//! The stage runs on the runner's side stream `Lane` (capscope/stage/stage.hpp); also a hook
//! option (capscope/hooks/hook.hpp).
template <int Lane>
struct on_lane {
    static_assert(Lane >= 1 && Lane <= max_lanes, "capscope::on_lane<k>: lanes are numbered 1..capscope::max_lanes (0 is the step's stream)");
    static constexpr int lane = Lane;
    static constexpr void apply(stage_facts& f) { f.lane = Lane; }
};

//! The stage keeps these module inputs for its backward (what activation offloading may move).
template <offload_module... Ms>
struct saves {
    static constexpr void apply(stage_facts& f) { (f.saves.insert(Ms), ...); }
};
//! The stage writes these module inputs, which a later stage of its layer keeps.
template <offload_module... Ms>
struct makes {
    static constexpr void apply(stage_facts& f) { (f.makes.insert(Ms), ...); }
};
//! `saves` and `makes` by a trainer's own offload names (`saves_named<"mixer_in">`).
template <detail::fixed_string... Names>
struct saves_named {
    static constexpr void apply(stage_facts& f) { (f.saves.insert(Names.view()), ...); }
};
template <detail::fixed_string... Names>
struct makes_named {
    static constexpr void apply(stage_facts& f) { (f.makes.insert(Names.view()), ...); }
};

//! Where a guarded stage's flag is written: by an earlier stage of its layer (`writes_flags<...>`
//! says which), or before the layer runs (step_begin, an earlier layer), where the schema cannot
//! see it.
enum class flag_writer { this_layer, before_layer };
namespace detail {
constexpr void apply_guard(stage_facts& f, guard_kind kind, std::string_view flag, flag_writer writer) {
    f.guarded = kind;
    f.guard_flag = flag;
    f.guard_flag_written_before = writer == flag_writer::before_layer;
}
} // namespace detail
//! The stage runs only when the guard flag `Flag` holds (IF; capscope/stage/stage_guard.hpp);
//! the bound stage's `guard` is `run_if` of a tensor named `Flag`. (Structs, not aliases of one
//! template: nvcc's front end loses string arguments passed through an alias.)
template <detail::fixed_string Flag, flag_writer Writer = flag_writer::this_layer>
struct run_if_holds {
    static constexpr void apply(stage_facts& f) { detail::apply_guard(f, guard_kind::if_holds, Flag.view(), Writer); }
};
//! The stage runs again and again while the guard flag `Flag` holds (WHILE).
template <detail::fixed_string Flag, flag_writer Writer = flag_writer::this_layer>
struct run_while_holds {
    static constexpr void apply(stage_facts& f) { detail::apply_guard(f, guard_kind::while_holds, Flag.view(), Writer); }
};
//! The stage writes these guard flags.
template <detail::fixed_string... Flags>
struct writes_flags {
    static constexpr void apply(stage_facts& f) { (f.flags_written.insert(Flags.view()), ...); }
};

namespace detail {
template <class P>
concept stage_property = requires(stage_facts& f) { P::apply(f); };
template <class R>
inline constexpr bool is_regions = false;
template <class... Ms>
inline constexpr bool is_regions<region_list<Ms...>> = true;
} // namespace detail

//! One stage of a layer schema: its kind (a `stage_kind`, or a literal naming the trainer's own),
//! the regions that contain it, its properties.
template <auto Kind, class Regions = regions<>, class... Properties>
struct stage_decl {
    static_assert(detail::is_regions<Regions>, "capscope::stage_decl<kind, regions<...>, properties...>: the second argument is regions<...>");
    static_assert(sizeof(Regions) > 0); // checks the regions where the schema is named
    static_assert((detail::stage_property<Properties> && ...),
                  "capscope::stage_decl<...> properties are synchronizes_with_host, shapes_depend_on_data, passes_host_values, updated_in_graph, "
                  "on_lane<k>, saves<offload_module...>, makes<offload_module...>, saves_named<\"...\">, makes_named<\"...\">, "
                  "run_if_holds<\"flag\">, run_while_holds<\"flag\"> and writes_flags<\"...\">");
    static_assert(std::is_same_v<std::remove_cv_t<decltype(Kind)>, stage_kind> || requires { Kind.view(); },
                  "capscope::stage_decl<kind, ...>: the kind is a stage_kind (stage_kind::attention, ...) or a trainer's own, "
                  "capscope::kind<\"name\">");
    static constexpr auto kind = Kind;
    static constexpr stage_facts facts(int layer) {
        stage_facts f;
        f.kind = kind_id();
        f.layer = layer;
        f.captured_by = Regions::set;
        (Properties::apply(f), ...);
        return f;
    }
    //! A stage as this declaration says, bound to `forward` and `backward`, with its buffers
    //! declared (`inputs`, `outputs`, and `buffers_declared` when they name every one it touches).
    static stage make(std::string name, int layer, stream_fn forward, stream_fn backward = {}) {
        const stage_facts f = facts(layer);
        stage s;
        s.name = std::move(name);
        s.layer = layer;
        s.kind = f.kind;
        s.captured_by = f.captured_by;
        s.synchronizes_with_host = f.synchronizes_with_host;
        s.shapes_depend_on_data = f.shapes_depend_on_data;
        s.passes_host_values = f.passes_host_values;
        s.updated_in_graph = f.updated_in_graph;
        s.lane = f.lane;
        s.makes = f.makes; // what it saves, the trainer lists with its tensors (stage::saves)
        s.forward = forward;
        s.backward = backward;
        return s;
    }

private:
    static constexpr stage_kind_id kind_id() {
        if constexpr (std::is_same_v<std::remove_cv_t<decltype(Kind)>, stage_kind>) return Kind;
        else return stage_kind_id{Kind.view()};
    }
};

namespace detail {
template <class T>
inline constexpr bool is_stage_decl = false;
template <auto K, class R, class... Ps>
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
    //! The declaration of stage `I`.
    template <std::size_t I>
    using stage_at = std::tuple_element_t<I, std::tuple<Stages...>>;
};

//! The layer kinds a model is made of, for the bind-time check.
template <class... Layers>
struct layer_schemas {
    static constexpr std::size_t size = sizeof...(Layers);
};

} // namespace capscope
