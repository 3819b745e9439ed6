#pragma once
//! @file
//! The plan of one layer kind under a configuration, as a constant: `layer_plan<Config, Layer>`
//! splits the schema's stages into segments (graphs and eager islands) with the same code the
//! run-time plan uses. Naming it with a configuration that captures a stage that cannot be
//! captured fails to compile with rule P1, P2 or P8, naming the stage and the fix; one that
//! offloads a tensor across a graph boundary of the layer, with rule P11.
//!
//! @code
//! using plan = layer_plan<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, ...>, dense_layer>;
//! static_assert(plan::graphs == 1);
//! @endcode

#include <capscope/plan/capture_region.hpp>
#include <capscope/plan/guarded_stage.hpp>
#include <capscope/plan/misplaced_stage.hpp>
#include <capscope/plan/offload_placement.hpp>
#include <capscope/stage/schema.hpp>

#include <array>
#include <cstddef>

namespace capscope {

//! A configuration's capture scope, read off a `config<...>`: its impl, and the regions it
//! captures (Megatron's modules and the trainer's own).
template <class Config>
inline constexpr capture_scope capture_scope_of = {Config::impl, Config::regions};

//! The module inputs a configuration offloads (none when offloading is off).
template <class Config>
inline constexpr offload_name_set offloaded_by =
    Config::normalized.offload.enabled ? Config::normalized.offload.modules : offload_name_set{};

template <class Config, class Layer>
struct layer_plan {
    static constexpr std::array<stage_facts, Layer::size> stages = Layer::facts();
    static constexpr misplacement misplaced = find_misplacement(capture_scope_of<Config>, stages);
    using misplacement_report = decltype(detail::report_misplacement<Config, Layer, misplaced.stage,
                                         Layer::template stage_at<std::size_t(misplaced.found() ? misplaced.stage : 0)>::kind,
                                         misplaced.problem>{});
    static constexpr offload_straddle straddle = find_offload_straddle(capture_scope_of<Config>, offloaded_by<Config>, stages);
    static constexpr guard_finding guarded = find_guard_problem(stages);
    using guard_report = decltype(detail::report_guard_problem<Layer, guarded.stage, guarded.problem>{});
    using straddle_report = decltype(detail::report_offload_straddle<Config, Layer, straddle.producer, straddle.keeper, detail::offload_tensor_of(straddle.module.view())>{});

    //! The segments in forward order (backward runs them in reverse).
    static constexpr auto segments = [] {
        std::array<stage_range, Layer::size> out{};
        std::size_t n = 0;
        split_segments(capture_scope_of<Config>, stages, [&](stage_range r) { out[n++] = r; });
        return out;
    }();
    static constexpr int segment_count = split_segments(capture_scope_of<Config>, stages, [](stage_range) {});
    static constexpr int graphs = [] {
        int g = 0;
        for (int i = 0; i < segment_count; ++i) g += segments[std::size_t(i)].graphed ? 1 : 0;
        return g;
    }();
    static constexpr int eager_islands = segment_count - graphs;
};

//! The plans of every layer kind a runner is declared with: each checked (P1, P2, P8), and
//! together they must capture something when the config names regions (P9).
template <class Config, class... Layers>
struct layer_plans {
    static constexpr bool names_regions = is_per_layer(Config::impl) && !Config::regions.empty();
    static constexpr int graphs = (0 + ... + layer_plan<Config, Layers>::graphs);
    static_assert(sizeof...(Layers) == 0 || !names_regions || graphs > 0,
                  "capscope plan rule P9: the config's modules<...> / capture_regions<...> match no stage of the runner's layer schemas, "
                  "so it would capture nothing -- fix: name regions the schemas' stages are in (a trainer's own with "
                  "capture_regions<...>), or none (modules<>) to capture whole layers");
};

} // namespace capscope
