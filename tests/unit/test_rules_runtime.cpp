// Run-time enforcer: every rule holds on one configuration and fires on another.
#include "rule_cases.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

using namespace capscope;

namespace {
bool contains(const std::vector<finding>& fs, std::string_view id) {
    return std::any_of(fs.begin(), fs.end(), [&](const finding& f) { return f.rule->id == id; });
}
} // namespace

TEST_CASE("every rule in the table has a holds/breaks case") {
    std::set<std::string_view> covered;
    for (const auto& c : test::all_rule_cases()) covered.insert(c.id);
    for (const rule_info& r : rule_table) CHECK_MESSAGE(covered.count(r.id) == 1, "no run-time case for rule ", r.id);
    CHECK(covered.size() == rule_table.size());
}

TEST_CASE("each rule holds on its valid twin and fires on its broken config") {
    for (const auto& c : test::all_rule_cases()) {
        const rule_info* rule = find_rule(c.id);
        REQUIRE_MESSAGE(rule != nullptr, c.id);
        CAPTURE(c.id);
        auto holds = validate(c.holds);
        auto breaks = validate(c.breaks);
        CHECK_FALSE(contains(holds.violations, c.id));
        CHECK_FALSE(contains(holds.notes, c.id));
        switch (rule->kind) {
        case rule_kind::error:
            CHECK(contains(breaks.violations, c.id));
            CHECK_FALSE(breaks.valid());
            break;
        case rule_kind::migration:
        case rule_kind::adjustment:
            CHECK(contains(breaks.notes, c.id));
            break;
        case rule_kind::default_value: // derives silently: it fires, changes the value, adds no note
            CHECK(rule->fires(c.breaks));
            CHECK_FALSE(contains(breaks.notes, c.id));
            CHECK(breaks.normalized != c.breaks);
            break;
        }
    }
}

TEST_CASE("validate reports every violation, not just the first") {
    runtime_config c;
    c.impl = graph_impl::ahead_of_time_per_layer;
    c.num_experts = 8;
    c.modules.modules = {capture_module::moe, capture_module::moe_router, capture_module::moe_preprocess};
    c.modules.entries = 3;
    c.recompute = recompute_granularity::full;
    auto r = validate(c);
    std::vector<std::string_view> ids;
    for (const auto& v : r.violations) ids.push_back(v.rule->id);
    CHECK(ids == std::vector<std::string_view>{"S2", "S6", "R1"});
}

TEST_CASE("a normalization error stops later stages and says so") {
    runtime_config c;
    c.enable_cuda_graph = c.external_cuda_graph = true;
    c.recompute = recompute_granularity::full;
    auto r = validate(c);
    REQUIRE(r.violations.size() == 1);
    CHECK(r.violations[0].rule->id == "N2");
    CHECK(r.later_stages_skipped);
}

TEST_CASE("adjustments are applied to the normalized configuration") {
    runtime_config c;
    c.impl = graph_impl::lazy_per_layer;
    c.num_experts = 4;
    c.modules.modules = {capture_module::moe_router};
    c.modules.entries = 1;
    auto r = validate(c);
    CHECK(r.valid());
    CHECK(r.normalized.modules.modules == capture_module_set{capture_module::moe_router, capture_module::moe_preprocess});
    CHECK(r.normalized.inference == inference_scope::per_layer);
}

TEST_CASE("messages name the offending value") {
    runtime_config c;
    c.unknown_impl = detail::short_text("lokal");
    auto r = validate(c);
    REQUIRE(r.violations.size() == 1);
    CHECK(r.violations[0].text().find("'lokal'") != std::string::npos);
}
