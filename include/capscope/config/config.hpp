#pragma once
//! @file
//! `config<Options…>`: a CUDA-graph configuration checked by the compiler.
//!
//! The options are folded into a `runtime_config` (`requested`), and the rule table is walked
//! in a constant expression. If a rule rejects, instantiating the config fails with exactly one
//! error, `static assertion failed: capscope rule <ID>: <message> -- fix: <fix>` (the whole
//! diagnostic is at most 15 lines under g++ and nvcc; the compile-fail suite measures it). Otherwise
//! `normalized` is what will run, and equals the normalized form of any run-time configuration
//! that means the same thing (option order carries no meaning).
//!
//! At compile time, rules Megatron applies silently (kind `adjustment`: S1's router/preprocess
//! completion, OB1/OB2's offload downgrade at graph boundaries) are errors: a C++ configuration
//! must spell out what will run. Migrations of deprecated spellings are applied.

#include <capscope/config/engine_options.hpp>
#include <capscope/config/option.hpp>
#include <capscope/config/spelling.hpp>
#include <capscope/rules/diagnostics.hpp>
#include <capscope/rules/evaluate.hpp>

namespace capscope {

namespace detail {
//! Folds the options that write a `Target` (a `runtime_config`, or the `engine_settings`) into one.
template <class Target, class... Options>
constexpr Target fold_options() {
    Target t;
    auto add = [&]<class O>() {
        if constexpr (requires(Target& x) { O::apply(x); }) O::apply(t);
    };
    (void)add; // an empty list uses it not at all
    (add.template operator()<Options>(), ...);
    return t;
}

template <class... Options>
constexpr runtime_config collect_options() { return fold_options<runtime_config, Options...>(); }

//! What `config<Options...>` asks for, or Megatron's defaults where it is spelled wrong (rules
//! K1-K3 report it; no value of it is read, so that report is the one error).
template <class... Options>
constexpr runtime_config requested_options() {
    if constexpr (config_spelling<Options...>() == spelling::right) return collect_options<Options...>();
    else return runtime_config{};
}

//! Instantiating it fails the rejecting rule's one static_assert (rules/diagnostics.hpp). A base
//! class, not a `sizeof` in a static_assert: clang then reports that one error and no second one.
template <class Config, int RuleIndex>
struct report_rejection {}; // accepted: nothing to report
template <class Config, int RuleIndex>
    requires(RuleIndex >= 0)
struct report_rejection<Config, RuleIndex> : rule_diagnostics::rejected<RuleIndex, Config> {};
} // namespace detail

template <class... Options>
struct config {
    //! How the options are spelled: a kind named twice, a value that is no number, an argument that
    //! is no option (rules K1-K3, capscope/config/spelling.hpp) is the one error, before any rule.
    static constexpr detail::spelling spelled = detail::config_spelling<Options...>();
    using spelling_report = decltype(detail::report_spelling<spelled, config>{});

    //! What the options ask for, deprecated spellings included.
    static constexpr runtime_config requested = detail::requested_options<Options...>();
    static constexpr first_rejection verdict = find_first_rejection(requested, enforcement::compile_time);
    using rejection_report = decltype(detail::report_rejection<config, spelled == detail::spelling::right ? verdict.rule_index : -1>{});

    //! What will run: every migration and derived default applied.
    static constexpr runtime_config normalized = verdict.normalized;

    static constexpr graph_impl impl = normalized.impl;
    static constexpr capture_module_set modules = normalized.modules.modules;
    static constexpr inference_scope inference = *normalized.inference;
    static constexpr int warmup_steps = normalized.warmup_steps;

    //! How capscope's runners capture (not a Megatron setting).
    static constexpr engine_settings engine = detail::fold_options<engine_settings, Options...>();
    //! The regions a per-layer impl captures: Megatron's `modules` and the trainer's own
    //! (`capture_regions<...>`); none = whole layers.
    static constexpr region_set regions = [] {
        region_set r(modules);
        r.insert_all(engine.regions);
        return r;
    }();
};

//! The id of the rule that would reject `config<Options…>` (a spelling rule K1-K3 first), or ""
//! when it is valid; found without instantiating it (no diagnostic).
template <class... Options>
inline constexpr std::string_view rejecting_rule = [] {
    if constexpr (constexpr detail::spelling s = detail::config_spelling<Options...>(); s != detail::spelling::right) {
        return detail::spelling_rule(s);
    } else {
        auto v = find_first_rejection(detail::collect_options<Options...>(), enforcement::compile_time);
        return v.accepted() ? std::string_view{} : rule_table[static_cast<std::size_t>(v.rule_index)].id;
    }
}();

//! Whether `config<Options…>` would compile, without instantiating it (no diagnostic).
template <class... Options>
inline constexpr bool is_valid_config = rejecting_rule<Options...>.empty();

//! Two configs that normalize to the same thing (e.g. the same options in another order).
template <class A, class B>
inline constexpr bool same_config = A::normalized == B::normalized;

} // namespace capscope
