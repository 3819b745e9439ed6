#pragma once
//! @file
//! The run-time enforcer: `validate(runtime_config)` reports *every* violation, with the same
//! ids, messages and fixes as the compile-time enforcer, plus notes for migrations and
//! adjustments Megatron applies silently.

#include <capscope/rules/evaluate.hpp>

#include <string>
#include <vector>

namespace capscope {

struct finding {
    const rule_info* rule;
    std::string subject; //!< the offending name, when the rule is about one

    //! The message, naming the offending value when there is one.
    std::string text() const {
        std::string t(rule->message);
        if (!subject.empty()) t += " (got '" + subject + "')";
        return t;
    }
};

struct validation_report {
    std::vector<finding> violations;
    std::vector<finding> notes;
    runtime_config normalized;      //!< after every migration/adjustment (meaningful when valid)
    bool later_stages_skipped = false; //!< normalization failed, so rules after it were not evaluated

    bool valid() const { return violations.empty(); }
};

//! Evaluates every rule in table order. Normalization errors stop migrations and skip the
//! later stages (their rules read normalized values); all other violations are collected.
inline validation_report validate(const runtime_config& requested) {
    validation_report report;
    runtime_config c = requested;
    bool normalization_failed = false;
    for (const rule_info& rule : rule_table) {
        if (normalization_failed && rule.stage != rule_stage::normalization) {
            report.later_stages_skipped = true;
            break;
        }
        if (!rule.fires(c)) continue;
        std::string subject = rule.subject ? std::string(rule.subject(c)) : std::string();
        if (rule.kind == rule_kind::error) {
            report.violations.push_back({&rule, std::move(subject)});
            normalization_failed = normalization_failed || rule.stage == rule_stage::normalization;
            continue;
        }
        if (normalization_failed) continue;
        rule.apply(c);
        if (rule.kind != rule_kind::default_value) report.notes.push_back({&rule, std::move(subject)});
    }
    if (!normalization_failed) canonicalize(c);
    report.normalized = c;
    return report;
}

} // namespace capscope
