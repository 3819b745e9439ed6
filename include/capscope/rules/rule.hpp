#pragma once
//! @file
//! What a rule is, and the one macro that defines it.
//!
//! `CAPSCOPE_RULE(ID, kind, stage, statement, message, fix, apply, fires…)` defines
//! `capscope::rules::ID` holding `info`: id, one-line statement, message, fix, kind, stage,
//! predicate and adjustment, read by the run-time enforcer (`validate`), the CLI and the
//! generated docs/rules.md. The compile-time enforcer's diagnostics
//! (`capscope/rules/diagnostics.hpp`, `static_assert` text `capscope rule ID: message -- fix:
//! fix`) are generated from this same `info`, and a test fails when they drift, so the two
//! enforcers cannot disagree on wording. (They are generated rather than written inside this
//! macro so that the compiler's first error carries no macro-expansion notes.)

#include <capscope/vocabulary/runtime_config.hpp>

#include <string_view>

namespace capscope {

enum class rule_kind {
    error,       //!< the configuration cannot work
    migration,   //!< a deprecated input is rewritten (reported as a note at run time)
    default_value, //!< an unset value is derived (silent)
    adjustment,  //!< Megatron silently completes or downgrades; a note at run time, an error
                 //!< at compile time ("write what will run")
};

enum class rule_stage { normalization, capture_scope, recompute, offload, training, fsdp, vision };

struct rule_info {
    std::string_view id;
    std::string_view statement;  //!< the rule, one line
    std::string_view message;    //!< what is wrong when it fires
    std::string_view fix;        //!< how to change the configuration
    rule_kind kind;
    rule_stage stage;
    void (*apply)(runtime_config&);           //!< migration/adjustment; nullptr for errors
    bool (*fires)(const runtime_config&);
    //! The offending name, when the message is about one (unknown module, impl …).
    std::string_view (*subject)(const runtime_config&) = nullptr;
};

constexpr std::string_view kind_name(rule_kind k) {
    switch (k) {
    case rule_kind::error: return "error";
    case rule_kind::migration: return "migration";
    case rule_kind::default_value: return "default";
    case rule_kind::adjustment: return "adjustment";
    }
    return "?";
}

constexpr std::string_view stage_name(rule_stage s) {
    switch (s) {
    case rule_stage::normalization: return "normalization";
    case rule_stage::capture_scope: return "capture scope";
    case rule_stage::recompute: return "recompute";
    case rule_stage::offload: return "offload";
    case rule_stage::training: return "training";
    case rule_stage::fsdp: return "fsdp";
    case rule_stage::vision: return "vision";
    }
    return "?";
}

//! Whether the compile-time enforcer rejects a configuration when this rule fires.
constexpr bool rejects_at_compile_time(rule_kind k) { return k == rule_kind::error || k == rule_kind::adjustment; }

namespace detail {
template <class...>
inline constexpr bool always_false = false;
} // namespace detail

} // namespace capscope

#define CAPSCOPE_RULE(ID, KIND, STAGE, STATEMENT, MESSAGE, FIX, APPLY, ...)                              \
    struct ID {                                                                                          \
        static constexpr ::capscope::rule_info info{#ID,       STATEMENT, MESSAGE, FIX,                  \
                                                    ::capscope::rule_kind::KIND,                        \
                                                    ::capscope::rule_stage::STAGE, APPLY, __VA_ARGS__}; \
    }
