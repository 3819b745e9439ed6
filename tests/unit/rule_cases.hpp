#pragma once
// For every rule: a configuration where it holds and one that breaks it (run-time enforcer).

#include <capscope/capscope.hpp>

#include <functional>
#include <string_view>
#include <vector>

namespace capscope::test {

struct rule_case {
    std::string_view id;
    runtime_config holds;
    runtime_config breaks;
};

inline runtime_config make(std::function<void(runtime_config&)> f) {
    runtime_config c;
    f(c);
    return c;
}

inline module_request mods(std::initializer_list<capture_module> ms) {
    module_request r;
    for (auto m : ms) { r.modules.insert(m); ++r.entries; }
    return r;
}

std::vector<rule_case> all_rule_cases();

} // namespace capscope::test
