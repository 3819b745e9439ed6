#pragma once
//! @file
//! Which stages a configuration captures, how a stage list splits into segments, and the first
//! stage that is captured but cannot be. All constexpr: the run-time plan and the compile-time
//! layer plan run this same code.

#include <capscope/plan/segment.hpp>
#include <capscope/stage/stage.hpp>
#include <capscope/vocabulary/graph_impl.hpp>

#include <span>

namespace capscope {

//! The part of a configuration the plan reads.
struct capture_scope {
    graph_impl impl = graph_impl::eager;
    region_set regions; //!< the regions captured; none = whole layers (per-layer impls)
    friend constexpr bool operator==(const capture_scope&, const capture_scope&) = default;
};

//! Whether `s` is inside a region the configuration captures. Per-layer impls capture stages of
//! layers (layer >= 0) whose regions meet the configuration's, or every layer stage when it
//! names none; the whole iteration captures everything, the model's ends and the
//! step-level work included.
constexpr bool inside_captured_region(const capture_scope& c, const stage_facts& s) {
    switch (c.impl) {
    case graph_impl::eager: return false;
    case graph_impl::whole_iteration: return true;
    case graph_impl::lazy_per_layer:
    case graph_impl::ahead_of_time_per_layer: return s.layer >= 0 && (c.regions.empty() || s.captured_by.intersects(c.regions));
    }
    return false;
}

enum class misplacement_problem : std::uint8_t { none, synchronizes_with_host, shapes_depend_on_data, passes_host_values };

struct misplacement {
    int stage = -1; //!< index in the list, -1 when none
    misplacement_problem problem = misplacement_problem::none;
    constexpr bool found() const { return stage >= 0; }
};

//! Why a stage cannot be captured (the first of its facts that forbids it), or none.
constexpr misplacement_problem capture_problem(const stage_facts& s) {
    if (s.synchronizes_with_host) return misplacement_problem::synchronizes_with_host;
    if (s.shapes_depend_on_data) return misplacement_problem::shapes_depend_on_data;
    if (s.passes_host_values && !s.updated_in_graph) return misplacement_problem::passes_host_values;
    return misplacement_problem::none;
}

//! The first stage inside a captured region that cannot be captured.
constexpr misplacement find_misplacement(const capture_scope& c, std::span<const stage_facts> stages) {
    for (std::size_t i = 0; i < stages.size(); ++i) {
        const misplacement_problem p = capture_problem(stages[i]);
        if (p != misplacement_problem::none && inside_captured_region(c, stages[i])) return {static_cast<int>(i), p};
    }
    return {};
}

//! Splits a stage list into segments: maximal runs of consecutive stages that are all captured
//! or all eager. Except in the whole iteration, which is one segment, a segment never crosses a
//! layer boundary (one graph per layer and run of regions) nor a change of lane (a segment runs
//! on one stream), except for a branch stage, which stays in the segment it is forked from. Calls `emit(stage_range)` in list order and returns the number of segments.
template <class Emit>
constexpr int split_segments(const capture_scope& c, std::span<const stage_facts> stages, Emit&& emit) {
    int n = 0;
    std::size_t i = 0;
    while (i < stages.size()) {
        const bool graphed = inside_captured_region(c, stages[i]);
        std::size_t j = i + 1;
        while (j < stages.size() && inside_captured_region(c, stages[j]) == graphed &&
               (c.impl == graph_impl::whole_iteration ||
                (stages[j].layer == stages[i].layer && (stages[j].branch || stages[j].lane == stages[i].lane))))
            ++j;
        emit(stage_range{static_cast<int>(i), static_cast<int>(j - i), graphed});
        ++n;
        i = j;
    }
    return n;
}

} // namespace capscope
