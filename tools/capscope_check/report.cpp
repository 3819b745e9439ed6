#include "report.hpp"

#include <capscope/rules/not_applicable.hpp>

#include <fmt/format.h>

namespace capscope::check {

namespace {
nlohmann::json field_json(const described_field& f) {
    if (f.is_list) return f.items;
    if (f.items.empty()) return nullptr;
    if (f.is_bool) return f.items.front() == "true";
    if (f.is_number) return nlohmann::json::parse(f.items.front(), nullptr, false);
    return f.items.front();
}
nlohmann::json findings_json(const std::vector<finding>& fs) {
    auto out = nlohmann::json::array();
    for (const finding& f : fs)
        out.push_back({{"rule", f.rule->id}, {"kind", kind_name(f.rule->kind)}, {"message", f.text()}, {"fix", f.rule->fix}});
    return out;
}
} // namespace

nlohmann::json to_json(const flags::megatron_command_line& line, const validation_report& report) {
    nlohmann::json normalized = nlohmann::json::object();
    for (const described_field& f : describe(report.normalized)) normalized[f.key] = field_json(f);
    auto refused = nlohmann::json::array();
    for (const auto& r : line.refused_inputs) refused.push_back({{"where", r.where}, {"message", r.message}, {"fix", r.fix}});
    return {
        {"valid", report.valid() && line.refused_inputs.empty()},
        {"refused_inputs", refused},
        {"normalized", report.later_stages_skipped ? nlohmann::json(nullptr) : normalized},
        {"violations", findings_json(report.violations)},
        {"notes", findings_json(report.notes)},
        {"later_stages_skipped", report.later_stages_skipped},
        {"derived",
         {{"params_dtype", line.derived.params_dtype},
          {"pipeline_model_parallel_size", line.derived.pipeline_model_parallel_size},
          {"virtual_pipeline_model_parallel_size", line.derived.virtual_pipeline_model_parallel_size
                                                       ? nlohmann::json(*line.derived.virtual_pipeline_model_parallel_size)
                                                       : nlohmann::json(nullptr)},
          {"mtp_num_layers", line.derived.mtp_num_layers}}},
        {"read", line.read},
        {"ignored", line.ignored},
        {"unknown", line.unknown},
    };
}

std::string to_text(const flags::megatron_command_line& line, const validation_report& report, bool verbose) {
    // The verdict and what to fix first; the normalized configuration (45 lines) only when asked.
    std::string out;
    if (!line.refused_inputs.empty()) {
        out += fmt::format("capscope-check: the configuration is INVALID: Megatron refuses {} input{} before the CUDA-graph rules\n",
                           line.refused_inputs.size(), line.refused_inputs.size() == 1 ? "" : "s");
        for (const auto& r : line.refused_inputs) out += fmt::format("  [{}] {}\n      fix: {}\n", r.where, r.message, r.fix);
        out += "\n";
    }
    if (report.valid() && line.refused_inputs.empty()) out += "capscope-check: the configuration is VALID\n";
    else if (!line.refused_inputs.empty())
        out += fmt::format("the CUDA-graph rules: {} violation{}\n", report.violations.size(), report.violations.size() == 1 ? "" : "s");
    else out += fmt::format("capscope-check: the configuration is INVALID ({} violation{})\n", report.violations.size(),
                            report.violations.size() == 1 ? "" : "s");
    if (!report.violations.empty()) {
        out += "\nviolations:\n";
        for (const finding& v : report.violations)
            out += fmt::format("  [{}] {}\n      fix: {}\n", v.rule->id, v.text(), v.rule->fix);
    }
    if (!report.notes.empty()) {
        out += "\nnotes (migrations and adjustments Megatron applies):\n";
        for (const finding& n : report.notes) out += fmt::format("  [{}] {}\n      to be explicit: {}\n", n.rule->id, n.text(), n.rule->fix);
    }
    if (!line.ignored.empty()) {
        out += "\nignored (Megatron flags no capture rule reads):";
        for (const auto& f : line.ignored) out += " " + f;
        out += "\n";
    }
    if (!line.unknown.empty()) {
        out += "\nunknown (not Megatron-LM flags; ignored as asked):";
        for (const auto& f : line.unknown) out += " " + f;
        out += "\n";
    }
    if (report.later_stages_skipped) {
        out += "\nnormalized configuration: not available (normalization failed; later rules were not evaluated)\n";
    } else if (verbose) {
        out += "\nnormalized configuration:\n";
        for (const described_field& f : describe(report.normalized)) out += fmt::format("  {:<46} {}\n", f.key, f.text());
    } else {
        out += "\n(--verbose prints the normalized configuration)\n";
    }
    return out;
}

std::string rules_text() {
    std::string out;
    for (const rule_info& r : rule_table)
        out += fmt::format("{:<5} {:<10} {:<14} {}\n", r.id, kind_name(r.kind), stage_name(r.stage), r.statement);
    return out;
}

std::string rules_markdown() {
    auto cell = [](std::string_view s) {
        std::string t(s);
        for (std::size_t p = 0; (p = t.find('|', p)) != std::string::npos; p += 2) t.replace(p, 1, "\\|");
        return t;
    };
    std::string out =
        "# capscope rules\n\n"
        "<!-- Generated by `capscope-check --list-rules --markdown`; a test fails when this file is stale. -->\n\n"
        "Every rule, in the order both enforcers evaluate them (Megatron's order: later rules see migrated values).\n"
        "Ids follow `../shared/reference/megatron-rules.md`; letters after a spec id (N3b, N8a …) split one spec row\n"
        "into its cases; OB1/OB2 are the graph-boundary offload adjustments of spec §4.4; V1–V5 the vision rules of §6.\n\n"
        "Kinds: **error** rejects at run time and compile time; **migration** rewrites a deprecated input (a note at\n"
        "run time); **default** derives an unset value silently; **adjustment** is something Megatron completes or\n"
        "downgrades silently: a note at run time, an error at compile time (a C++ configuration spells out what runs).\n\n"
        "| id | kind | stage | rule | message | fix |\n|---|---|---|---|---|---|\n";
    for (const rule_info& r : rule_table)
        out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.id, kind_name(r.kind), stage_name(r.stage),
                           cell(r.statement), cell(r.message), cell(r.fix));
    out += "\n## Not applicable\n\nSpec rules capscope does not enforce, and why.\n\n| spec id | rule | why not |\n|---|---|---|\n";
    for (const not_applicable_rule& n : not_applicable_rules)
        out += fmt::format("| {} | {} | {} |\n", n.id, cell(n.rule), cell(n.reason));
    return out;
}

} // namespace capscope::check
