#pragma once
// Output formats of capscope-check: text, JSON and the rules table (text and Markdown).

#include <capscope/capscope.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace capscope::check {

nlohmann::json to_json(const flags::megatron_command_line& line, const validation_report& report);
//! The verdict, the violations with their fixes, notes, ignored and unknown flags; the normalized
//! configuration after them with `verbose`.
std::string to_text(const flags::megatron_command_line& line, const validation_report& report, bool verbose);
std::string rules_text();
std::string rules_markdown();

} // namespace capscope::check
