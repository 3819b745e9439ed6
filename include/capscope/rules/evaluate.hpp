#pragma once
//! @file
//! The constexpr walk over the rule table shared by both enforcers.

#include <capscope/rules/table.hpp>

namespace capscope {

//! How the walk treats rules that only adjust a configuration.
enum class enforcement {
    run_time,     //!< adjustments are applied and reported as notes (Megatron's behaviour)
    compile_time, //!< adjustments reject: a C++ config must spell out what will run
};

struct first_rejection {
    int rule_index = -1;          //!< index into rule_table, -1 when none
    runtime_config normalized;    //!< the configuration after every migration/adjustment applied before it
    constexpr bool accepted() const { return rule_index < 0; }
};

//! After a successful normalization the module list holds real modules only; its entry count
//! (an input detail rules N5 reads) is made canonical so equal configurations compare equal.
constexpr void canonicalize(runtime_config& c) { c.modules.entries = c.modules.modules.size(); }

//! Walks the table in order and stops at the first rule that rejects under `mode`.
constexpr first_rejection find_first_rejection(runtime_config c, enforcement mode) {
    for (std::size_t i = 0; i < rule_table.size(); ++i) {
        const rule_info& rule = rule_table[i];
        if (!rule.fires(c)) continue;
        bool rejects = rule.kind == rule_kind::error ||
                       (mode == enforcement::compile_time && rule.kind == rule_kind::adjustment);
        if (rejects) return {static_cast<int>(i), c};
        rule.apply(c);
    }
    canonicalize(c);
    return {-1, c};
}

//! Normalizes a configuration that passes every rule (the form `select` compares).
constexpr runtime_config normalize_accepted(const runtime_config& c) {
    return find_first_rejection(c, enforcement::run_time).normalized;
}

} // namespace capscope
