// Prints include/capscope/rules/diagnostics.hpp: one class per rule that rejects at compile time,
// whose static_assert says "capscope rule <ID>: <message> -- fix: <fix>". The assertions are
// plain code, not a macro expansion, so g++ prints no macro-expansion notes under the first
// error. A unit test fails when the committed header differs from this program's output.

#include <capscope/rules/table.hpp>

#include <cstdio>
#include <string>
#include <string_view>

namespace {
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}
} // namespace

int main() {
    std::puts("#pragma once\n"
              "//! @file\n"
              "//! The compile-time diagnostic of each rule that rejects a `config<...>`: instantiating\n"
              "//! `rejected<I, Config>` for the I-th rule of the table fails one static_assert whose text is\n"
              "//! \"capscope rule <ID>: <message> -- fix: <fix>\". GENERATED from the rule table by\n"
              "//! tools/rule_diagnostics (a unit test fails when this file is stale); do not edit.\n"
              "\n"
              "#include <capscope/rules/rule.hpp>\n"
              "\n"
              "namespace capscope::rule_diagnostics {\n"
              "\n"
              "template <int Rule, class Config>\n"
              "struct rejected; // defined for the rules that reject at compile time only\n");
    for (std::size_t i = 0; i < capscope::rule_table.size(); ++i) {
        const auto& r = capscope::rule_table[i];
        if (!capscope::rejects_at_compile_time(r.kind)) continue;
        const std::string text = "capscope rule " + std::string(r.id) + ": " + std::string(r.message) + " -- fix: " + std::string(r.fix);
        std::printf("template <class Config>\nstruct rejected<%zu, Config> { // %s\n    static_assert(detail::always_false<Config>,\n"
                    "                  %s);\n};\n",
                    i, std::string(r.id).c_str(), literal(text).c_str());
    }
    std::puts("\n} // namespace capscope::rule_diagnostics");
    return 0;
}
