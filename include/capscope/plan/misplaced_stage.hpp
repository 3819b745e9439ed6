#pragma once
//! @file
//! The compile-time diagnostics of the plan: a configuration that captures a stage that cannot
//! be captured. One class per stage kind and problem, so the first error line names the stage
//! and the fix (a static_assert message must be a literal).

#include <capscope/plan/capture_region.hpp>
#include <capscope/rules/rule.hpp>

namespace capscope::plan_rules {

// One class per stage kind and problem, written out (not a macro expansion, so the first error
// carries no macro-expansion notes).

//! P1: a stage that reads device data back to the host is inside a captured segment.
template <stage_kind Kind, class Config>
struct P1;
//! P2: a stage whose launch shapes come from data is inside a captured segment.
template <stage_kind Kind, class Config>
struct P2;

template <class Config>
struct P1<stage_kind::embedding, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage embedding synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::attention, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage attention synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::mlp, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage mlp synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::moe_router, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_router synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::moe_preprocess, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_preprocess synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::moe_experts, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage moe_experts synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::mamba, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage mamba synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::head, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage head synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::optimizer, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage optimizer synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P1<stage_kind::other, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P1: stage other synchronizes with the host, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::embedding, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage embedding has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::attention, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage attention has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::mlp, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage mlp has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::moe_router, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_router has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::moe_preprocess, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_preprocess has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::moe_experts, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage moe_experts has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::mamba, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage mamba has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::head, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage head has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::optimizer, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage optimizer has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};
template <class Config>
struct P2<stage_kind::other, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P2: stage other has launch shapes that depend on data, yet the config captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make the MoE drop-and-pad");
};

} // namespace capscope::plan_rules

namespace capscope::detail {

template <class Config, stage_kind Kind, misplacement_problem Problem>
struct report_misplacement {
    static constexpr bool reported = true; // nothing misplaced
};
template <class Config, stage_kind Kind>
struct report_misplacement<Config, Kind, misplacement_problem::synchronizes_with_host> {
    static constexpr bool reported = sizeof(plan_rules::P1<Kind, Config>) > 0;
};
template <class Config, stage_kind Kind>
struct report_misplacement<Config, Kind, misplacement_problem::shapes_depend_on_data> {
    static constexpr bool reported = sizeof(plan_rules::P2<Kind, Config>) > 0;
};

} // namespace capscope::detail
