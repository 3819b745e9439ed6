#pragma once
//! @file
//! `plan_error`: a training program that cannot run under a configuration, found before any
//! capture. Its text names the rule, the stage, and what to change, like the rule table's.

#include <capscope/plan/capture_region.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace capscope {

class plan_error : public std::invalid_argument {
public:
    plan_error(std::string_view rule, std::string stage, const std::string& message, const std::string& fix)
        : std::invalid_argument("capscope plan rule " + std::string(rule) + ": " + message + " -- fix: " + fix),
          rule_(rule), stage_(std::move(stage)) {}
    //! "P1" (host sync captured), "P2" (data-dependent shapes captured), "P3" (the program's shape).
    const std::string& rule() const noexcept { return rule_; }
    //! The stage at fault, when there is one.
    const std::string& stage() const noexcept { return stage_; }

private:
    std::string rule_, stage_;
};

namespace detail {

inline std::string module_list(capture_module_set m) {
    std::string s;
    m.for_each([&](capture_module x) {
        if (!s.empty()) s += ", ";
        s += megatron_name(x);
    });
    return s.empty() ? std::string("(none)") : s;
}

//! What to change so that the misplaced stage `s` is no longer captured.
inline std::string misplacement_fix(const capture_scope& c, const stage_facts& s) {
    if (c.impl == graph_impl::whole_iteration)
        return "use a per-layer impl (local or transformer_engine) whose modules leave out " + module_list(s.captured_by) +
               ", or make the stage capturable";
    if (c.modules.empty())
        return "name the regions to capture instead of the whole layer (modules<>), leaving out " + module_list(s.captured_by);
    const capture_module_set capturing = c.modules.without(c.modules.without(s.captured_by)); // modules ∩ regions
    std::string fix = "drop " + module_list(capturing) + " from the modules";
    if (s.kind == stage_kind::moe_preprocess) fix += " (capture moe_router only), or make the MoE drop-and-pad";
    if (s.kind == stage_kind::moe_experts) fix += " (capture moe_router [+ moe_preprocess] instead), or make the MoE drop-and-pad";
    return fix;
}

inline std::string capture_description(const capture_scope& c) {
    if (c.impl == graph_impl::whole_iteration) return "impl full_iteration captures it";
    if (c.modules.empty()) return "impl " + std::string(megatron_name(c.impl)) + " captures whole layers, this one included";
    return "modules {" + module_list(c.modules) + "} capture it under impl " + std::string(megatron_name(c.impl));
}

[[noreturn]] inline void throw_misplacement(const capture_scope& c, const stage_facts& s, misplacement_problem p,
                                            const std::string& name) {
    const bool sync = p == misplacement_problem::synchronizes_with_host;
    throw plan_error(sync ? "P1" : "P2", name,
                     "stage '" + name + "' " +
                         (sync ? "synchronizes with the host" : "has launch shapes that depend on data") + ", yet " +
                         capture_description(c),
                     misplacement_fix(c, s));
}

} // namespace detail
} // namespace capscope
