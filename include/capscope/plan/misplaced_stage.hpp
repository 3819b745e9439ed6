#pragma once
//! @file
//! The compile-time diagnostics of the plan: a configuration that captures a stage that cannot
//! be captured. One class per rule and predefined stage kind, so that the first error line
//! names the rule, the stage and a fix that fits it (a static_assert message must be a
//! literal); a trainer's own kinds get the generic fix. The instantiation note below the error
//! names the kind, the layer schema and the stage's index in it.

#include <capscope/plan/capture_region.hpp>
#include <capscope/rules/rule.hpp>
#include <capscope/stage/stage_kind.hpp>

namespace capscope::plan_rules {

// Written out (not a macro expansion, so the first error carries no macro-expansion notes).

//! P1: a stage that reads device data back to the host is inside a captured segment (primary: a trainer's own kind).
template <auto Kind, class Schema, int Stage, class Config>
struct P1 {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: a stage of the trainer's own kind synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::embedding, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage embedding synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::attention, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage attention synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::mlp, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage mlp synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::moe_router, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_router synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::moe_preprocess, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_preprocess synchronizes with the host, yet the config captures it -- fix: capture moe_router only (drop moe_preprocess from modules<...>), or make the MoE drop-and-pad");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::moe_experts, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_experts synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::mamba, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage mamba synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::head, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage head synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::optimizer, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage optimizer synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P1<stage_kind::other, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage other synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
//! P2: a stage whose launch shapes come from data is inside a captured segment (primary: a trainer's own kind).
template <auto Kind, class Schema, int Stage, class Config>
struct P2 {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: a stage of the trainer's own kind has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::embedding, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage embedding has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::attention, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage attention has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::mlp, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage mlp has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::moe_router, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_router has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::moe_preprocess, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_preprocess has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::moe_experts, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_experts has launch shapes that depend on data, yet the config captures it -- fix: capture moe_router [+ moe_preprocess] instead of moe, or make the MoE drop-and-pad");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::mamba, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage mamba has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::head, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage head has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::optimizer, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage optimizer has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P2<stage_kind::other, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage other has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
//! P8: a stage that passes host values to its kernels at launch is inside a captured segment (primary: a trainer's own kind).
template <auto Kind, class Schema, int Stage, class Config>
struct P8 {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: a stage of the trainer's own kind passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::embedding, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage embedding passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::attention, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage attention passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::mlp, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage mlp passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::moe_router, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage moe_router passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::moe_preprocess, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage moe_preprocess passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::moe_experts, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage moe_experts passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::mamba, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage mamba passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::head, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage head passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::optimizer, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage optimizer passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};
template <class Schema, int Stage, class Config>
struct P8<stage_kind::other, Schema, Stage, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P8: stage other passes host values to its kernels at launch (a graph would freeze them), yet the config captures it -- fix: declare it updated_in_graph (recorded again and updated in the graph before each replay), or keep the values in device memory and read them there, then drop passes_host_values; or leave its regions out of modules<...> / capture_regions<...> (naming none captures whole layers, impl::whole_iteration everything)");
};

} // namespace capscope::plan_rules

namespace capscope::detail {

template <class Config, class Schema, int Stage, auto Kind, misplacement_problem Problem>
struct report_misplacement {}; // nothing misplaced
// Each rule's report is a base class, so clang shows its one static_assert and no second error.
template <class Config, class Schema, int Stage, auto Kind>
struct report_misplacement<Config, Schema, Stage, Kind, misplacement_problem::synchronizes_with_host>
    : plan_rules::P1<Kind, Schema, Stage, Config> {};
template <class Config, class Schema, int Stage, auto Kind>
struct report_misplacement<Config, Schema, Stage, Kind, misplacement_problem::shapes_depend_on_data>
    : plan_rules::P2<Kind, Schema, Stage, Config> {};
template <class Config, class Schema, int Stage, auto Kind>
struct report_misplacement<Config, Schema, Stage, Kind, misplacement_problem::passes_host_values>
    : plan_rules::P8<Kind, Schema, Stage, Config> {};

} // namespace capscope::detail
