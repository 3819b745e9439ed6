#pragma once
//! @file
//! `plan_error`: a training program that cannot run under a configuration, found before any
//! capture. Its text names the rule, the stage, and what to change, like the rule table's.

#include <capscope/plan/capture_region.hpp>

#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace capscope {

class plan_error : public std::invalid_argument {
public:
    plan_error(std::string_view rule, std::string stage, const std::string& message, const std::string& fix)
        : std::invalid_argument("capscope plan rule " + std::string(rule) + ": " + message + " -- fix: " + fix),
          rule_(rule), stage_(std::move(stage)) {}
    //! "P1" (host sync captured), "P2" (data-dependent shapes captured), "P3" (the program's shape),
    //! "P8" (host values passed at launch captured), "P9" (named regions match no stage), "P10"
    //! (model facts that are not the program's), "P11" (an offloaded tensor across graphs), "P12"
    //! (two calls that touch one buffer left unordered: the verifier), "P13" (a capture-time stage
    //! in an eager segment), "P14" (a guarded stage the host must act in), "P15" (a guard's flag
    //! not written before it is read, or a WHILE run that never writes it), "P16" (a guarded run
    //! split between segments or lanes), "P17" (nan_check_on_device with no guarded optimizer); inference: "P4" (bucket lists; P5 is compile-time only, and P6/P7 are
    //! thrown as `bucket_overflow` when a request is placed).
    const std::string& rule() const noexcept { return rule_; }
    //! The stage at fault, when there is one.
    const std::string& stage() const noexcept { return stage_; }

private:
    std::string rule_, stage_;
};

namespace detail {

//! "attn, mlp" (Megatron's names for its modules, a trainer's own names for its regions).
inline std::string module_list(const region_set& m) {
    std::string s;
    m.for_each([&](std::string_view x) {
        if (!s.empty()) s += ", ";
        s += x;
    });
    return s.empty() ? std::string("(none)") : s;
}

//! "qkv_linear, core_attn" (the names of offloadable tensors: Megatron's, then a trainer's own).
inline std::string names_of(const offload_name_set& m) {
    std::string s;
    m.for_each([&](offload_name x) {
        if (!s.empty()) s += ", ";
        s += x.view();
    });
    return s.empty() ? std::string("(none)") : s;
}

//! What to change so that the misplaced stage `s` is no longer captured. Advice about MoE
//! modes only for MoE stages; a stage in no region is told how to get one.
inline std::string misplacement_fix(const capture_scope& c, const stage_facts& s) {
    const bool regionless = s.captured_by.empty();
    if (c.impl == graph_impl::whole_iteration && s.layer < 0) // regions say nothing outside the layers
        return "use a per-layer impl (local or transformer_engine), which captures layer stages only and leaves this stage, outside "
               "the layers, eager; or make the stage capturable";
    if (c.impl == graph_impl::whole_iteration)
        return regionless ? std::string("use a per-layer impl (local or transformer_engine) with modules that name regions, "
                                        "tagging this stage with none of them, or make the stage capturable")
                          : "use a per-layer impl (local or transformer_engine) whose modules leave out " + module_list(s.captured_by) +
                                ", or make the stage capturable";
    if (regionless)
        return "a stage in no capture region is captured only with whole layers (modules<>): name the regions to capture "
               "(modules<...>) so that this stage is left out, or move it out of the layer (layer -1)";
    if (c.regions.empty())
        return "name the regions to capture instead of the whole layer (modules<>), leaving out " + module_list(s.captured_by);
    std::string fix = "drop " + module_list(c.regions.common(s.captured_by)) + " from the modules";
    if (s.kind == stage_kind::moe_preprocess) fix += " (capture moe_router only), or make the MoE drop-and-pad";
    if (s.kind == stage_kind::moe_experts) fix += " (capture moe_router [+ moe_preprocess] instead), or make the MoE drop-and-pad";
    return fix;
}

inline std::string capture_description(const capture_scope& c) {
    if (c.impl == graph_impl::whole_iteration) return "impl full_iteration captures it";
    if (c.regions.empty()) return "impl " + std::string(megatron_name(c.impl)) + " captures whole layers, this one included";
    return "modules {" + module_list(c.regions) + "} capture it under impl " + std::string(megatron_name(c.impl));
}

//! The rule a misplaced stage breaks, and what it does that a graph cannot hold.
constexpr std::string_view misplacement_rule(misplacement_problem p) {
    switch (p) {
    case misplacement_problem::synchronizes_with_host: return "P1";
    case misplacement_problem::shapes_depend_on_data: return "P2";
    case misplacement_problem::passes_host_values: return "P8";
    case misplacement_problem::none: break;
    }
    return "";
}
inline std::string misplacement_words(misplacement_problem p) {
    switch (p) {
    case misplacement_problem::synchronizes_with_host: return "synchronizes with the host";
    case misplacement_problem::shapes_depend_on_data: return "has launch shapes that depend on data";
    case misplacement_problem::passes_host_values: return "passes host values to its kernels at launch (a graph would freeze them)";
    case misplacement_problem::none: break;
    }
    return "";
}

[[noreturn]] inline void throw_misplacement(const capture_scope& c, const stage_facts& s, misplacement_problem p,
                                            const std::string& name) {
    std::string fix = misplacement_fix(c, s);
    if (p == misplacement_problem::passes_host_values)
        fix = "declare it updated_in_graph (it is captured, recorded again before each replay and its nodes updated in the graph), "
              "or keep the values in device memory and have the kernels read them there (as the example model's AdamW and dropout "
              "seed do), then drop passes_host_values; or " + fix;
    throw plan_error(misplacement_rule(p), name, "stage '" + name + "' " + misplacement_words(p) + ", yet " + capture_description(c), fix);
}

//! P9: a per-layer capture that names regions (modules<...>, capture_regions<...>) none of the
//! layer stages is in captures nothing, which is a mistake to say, not to run eagerly for ever.
inline void check_selection(const capture_scope& c, std::span<const stage_facts> stages) {
    if (!is_per_layer(c.impl) || c.regions.empty()) return;
    region_set present;
    bool layers = false;
    for (const stage_facts& s : stages) {
        if (s.layer < 0) continue;
        layers = true;
        if (s.captured_by.intersects(c.regions)) return;
        present.insert_all(s.captured_by);
    }
    if (!layers) return;
    throw plan_error("P9", "",
                     "modules {" + module_list(c.regions) + "} match no stage of the program, so impl " + std::string(megatron_name(c.impl)) +
                         " would capture nothing; its layer stages are in the regions {" + module_list(present) + "}",
                     "name regions the stages are in (a trainer's own with capture_regions<...>), or none (modules<>) to capture "
                     "whole layers");
}

} // namespace detail
} // namespace capscope
