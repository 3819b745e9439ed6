#pragma once
//! @file
//! The compile-time diagnostics of the plan: a configuration that captures a stage that cannot
//! be captured. One class per stage kind and problem, so the first error line names the stage
//! and the fix (a static_assert message must be a literal).

#include <capscope/plan/capture_region.hpp>
#include <capscope/rules/rule.hpp>

namespace capscope::plan_rules {

#define CAPSCOPE_PLAN_STAGE_KINDS(X) \
    X(embedding) X(attention) X(mlp) X(moe_router) X(moe_preprocess) X(moe_experts) X(mamba) X(head) X(optimizer) X(other)

//! P1: a stage that reads device data back to the host is inside a captured segment.
template <stage_kind Kind, class Config>
struct P1;
//! P2: a stage whose launch shapes come from data is inside a captured segment.
template <stage_kind Kind, class Config>
struct P2;

#define CAPSCOPE_PLAN_P1(KIND)                                                                                          \
    template <class Config>                                                                                             \
    struct P1<stage_kind::KIND, Config> {                                                                               \
        static_assert(::capscope::detail::always_false<Config>,                                                         \
                      "capscope plan rule P1: stage " #KIND " synchronizes with the host, yet the config captures it "  \
                      "-- fix: leave its regions out of modules<...> (modules<> captures whole layers, "               \
                      "impl::whole_iteration everything); for an MoE preprocess, capture moe_router only or make "      \
                      "the MoE drop-and-pad");                                                                          \
    };
#define CAPSCOPE_PLAN_P2(KIND)                                                                                          \
    template <class Config>                                                                                             \
    struct P2<stage_kind::KIND, Config> {                                                                               \
        static_assert(::capscope::detail::always_false<Config>,                                                         \
                      "capscope plan rule P2: stage " #KIND " has launch shapes that depend on data, yet the config "   \
                      "captures it -- fix: leave its regions out of modules<...> (modules<> captures whole layers, "    \
                      "impl::whole_iteration everything); for MoE experts, capture moe_router instead of moe or make "  \
                      "the MoE drop-and-pad");                                                                          \
    };
CAPSCOPE_PLAN_STAGE_KINDS(CAPSCOPE_PLAN_P1)
CAPSCOPE_PLAN_STAGE_KINDS(CAPSCOPE_PLAN_P2)
#undef CAPSCOPE_PLAN_P1
#undef CAPSCOPE_PLAN_P2
#undef CAPSCOPE_PLAN_STAGE_KINDS

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
