// capscope-check: check a Megatron-LM CUDA-graph configuration before spending GPU hours.
//
//   capscope-check [--json | --emit-cpp] [--verbose] [--ignore-unknown-flags] [--world-size N] [--from-yaml FILE] MEGATRON_FLAGS... [@ARGFILE]...
//   capscope-check [--json | --format github] --from-yaml FILE|DIR|PATTERN... [--each @ARGFILE...] [MEGATRON_FLAGS...]
//   capscope-check --list-rules [--markdown]
//   capscope-check --version
//
// One input: the full report. Several (more than one YAML config, every model_config.yaml under a
// directory, a glob, or --each: every @file its own input), or --format github: one verdict per
// input and a summary (--json: one JSON object per line); plain flags apply to every input.
// Exit status: 0 valid, 1 invalid, 2 usage error (including flags Megatron does not have); with
// several inputs, the worst.

#include "from_yaml.hpp"
#include "inference_graphs_report.hpp"
#include "inputs.hpp"
#include "pipeline_report.hpp"
#include "report.hpp"

#include <capscope/emit_cpp.hpp>
#include <capscope/version.hpp>
#include <capscope/flags/argument_file.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>

namespace {

//! The arguments for a comment: plain words as they are, any other in single quotes, as a shell
//! takes them back (but for control characters, which the comment shows as \xNN).
std::string quoted_command_line(const std::vector<std::string>& args) {
    std::string s;
    for (const auto& a : args) {
        const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%") ==
                                             std::string::npos;
        std::string word = a;
        if (!plain) {
            word = "'";
            for (char c : a) word += c == '\'' ? std::string("'\\''") : std::string(1, c);
            word += "'";
        }
        s += (s.empty() ? "" : " ") + word;
    }
    return s;
}

//! JSON text; bytes that are not UTF-8 (a Latin-1 config) become U+FFFD instead of an abort.
std::string json_text(const nlohmann::json& j, int indent) { return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace); }

//! Many inputs: a verdict (or annotations, or a JSON object) per input, then a summary.
int check_many(const std::vector<capscope::check::input>& inputs, const std::vector<std::string>& extra,
               const capscope::flags::parse_options& options, bool json, bool github) {
    using namespace capscope::check;
    std::vector<input_result> results;
    int worst = 0;
    for (const input& in : inputs) {
        results.push_back(check_input(in, extra, options));
        const input_result& r = results.back();
        worst = std::max(worst, r.status);
        if (json) {
            nlohmann::json j = r.status == 2 ? nlohmann::json{{"error", r.error}} : to_json(r.line, r.report);
            if (r.status != 2)
                if (const inference_graph_section g = derive_inference_graphs(r.line, r.report); g.shown) j["inference_graphs"] = inference_graphs_json(g);
            if (r.status != 2 && r.line.pipeline.shown) j["pipeline_schedule"] = pipeline_schedule_json(r.line.pipeline);
            j["input"] = r.path;
            j["status"] = r.status == 0 ? "valid" : r.status == 1 ? "invalid" : "usage";
            j["exit"] = r.status;
            std::cout << json_text(j, -1) << "\n";
        } else if (github) {
            if (const std::string a = github_annotation(r); !a.empty()) std::cout << a << "\n";
        } else {
            std::cout << verdict_line(r) << "\n";
        }
    }
    (json ? std::cerr : std::cout) << summary_line(results) << "\n";
    return worst;
}

int run(int argc, char** argv) {
    CLI::App app{"capscope-check: validate Megatron-LM CUDA-graph flags with capscope's rule table.\n"
                 "Pass the Megatron flags verbatim after the options below.",
                 "capscope-check"};
    bool json = false, verbose = false, emit_cpp = false, list_rules = false, markdown = false, ignore_unknown = false, version = false;
    bool each = false;
    std::string format = "text";
    std::optional<int> world_size;
    std::vector<std::string> yaml_values;
    app.add_option("--from-yaml", yaml_values,
                   "read the MODEL_ARGS mapping of Megatron-LM functional-test YAML configs (before any flags given on the command "
                   "line): files, directories (every model_config.yaml below them) or glob patterns; several are checked one by one")
        ->expected(1, -1);
    app.add_option("--world-size", world_size,
                   "the number of processes Megatron runs on (its WORLD_SIZE): with it the microbatch count is known, and the pipeline "
                   "schedule is checked for it")
        ->check(CLI::PositiveNumber);
    app.add_flag("--each", each, "check every @file of the command line as an input of its own");
    app.add_option("--format", format, "with several inputs: text (a verdict per input) or github (GitHub Actions annotations)")
        ->check(CLI::IsMember({"text", "github"}));
    app.add_flag("--version", version, "print capscope's version and the Megatron-LM commit its flag table comes from");
    app.add_flag("--json", json, "print the verdict as JSON");
    app.add_flag("--verbose", verbose, "print the normalized configuration after the verdict and the violations");
    app.add_flag("--emit-cpp", emit_cpp, "print a C++ translation unit that compiles iff the configuration is valid");
    app.add_flag("--list-rules", list_rules, "list every rule");
    app.add_flag("--markdown", markdown, "with --list-rules: print docs/rules.md");
    app.add_flag("--ignore-unknown-flags", ignore_unknown,
                 "report flags Megatron-LM does not have instead of failing (Megatron's ignore_unknown_args)");
    app.allow_extras();
    app.positionals_at_end(false);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (json && emit_cpp) {
        std::cerr << "capscope-check: choose one of --json and --emit-cpp\n";
        return 2;
    }
    if (json && format == "github") { // one would silently win over the other
        std::cerr << "capscope-check: choose one of --json and --format github\n";
        return 2;
    }
    if (version) {
        std::cout << "capscope-check " << CAPSCOPE_VERSION_STRING << "\nMegatron-LM flags: commit " << capscope::flags::megatron_commit << " ("
                  << capscope::flags::megatron_option_strings << " option strings)\n";
        return 0;
    }
    if (list_rules) {
        std::cout << (markdown ? capscope::check::rules_markdown() : capscope::check::rules_text());
        return 0;
    }

    // Several inputs: each checked on its own, plain flags applying to all.
    std::vector<capscope::check::input> inputs = capscope::check::expand_yaml_inputs(yaml_values);
    std::vector<std::string> extra;
    for (const auto& a : app.remaining()) {
        if (each && a.size() > 1 && a[0] == '@') inputs.push_back({capscope::check::input::kind::argument_file, a.substr(1), ""});
        else extra.push_back(a);
    }
    if (inputs.size() > 1 || each || format == "github") {
        if (emit_cpp) {
            std::cerr << "capscope-check: --emit-cpp takes one input\n";
            return 2;
        }
        if (inputs.empty()) {
            std::cerr << (each ? "capscope-check: --each found no @file, and no --from-yaml was given: nothing to check\n"
                               : "capscope-check: --format github checks --from-yaml files or --each @files, and none was given: "
                                 "nothing to check\n");
            return 2;
        }
        return check_many(inputs, extra, {.ignore_unknown = ignore_unknown, .world_size = world_size}, json, format == "github");
    }

    std::vector<std::string> megatron_args;
    capscope::flags::megatron_command_line line;
    try {
        // The YAML's arguments come first, so flags on the command line win (argparse: last wins).
        if (!inputs.empty() && !inputs.front().error.empty()) throw capscope::flags::flag_error(inputs.front().error);
        if (!inputs.empty()) megatron_args = capscope::check::model_args_from_yaml(inputs.front().path);
        for (auto& a : capscope::flags::expand_argument_files(app.remaining())) megatron_args.push_back(std::move(a));
        line = capscope::flags::from_megatron_flags(megatron_args, {.ignore_unknown = ignore_unknown, .world_size = world_size});
    } catch (const capscope::flags::flag_error& e) {
        std::cerr << "capscope-check: error: " << e.what() << "\n";
        return 2;
    }
    capscope::validation_report report = capscope::validate(line.config);

    const capscope::check::inference_graph_section graphs = capscope::check::derive_inference_graphs(line, report);
    if (json) {
        nlohmann::json j = capscope::check::to_json(line, report);
        if (graphs.shown) j["inference_graphs"] = capscope::check::inference_graphs_json(graphs);
        if (line.pipeline.shown) j["pipeline_schedule"] = capscope::check::pipeline_schedule_json(line.pipeline);
        std::cout << json_text(j, 2) << "\n";
    } else if (emit_cpp) {
        // A configuration that normalizes is emitted as Megatron runs it (migrations and
        // adjustments applied); one that does not is emitted as written, so the compiler
        // rejects it for the same normalization rule.
        const capscope::runtime_config& emitted = report.later_stages_skipped ? line.config : report.normalized;
        std::vector<std::string> header{"From: " + quoted_command_line(megatron_args),
                                        std::string("capscope-check verdict: ") + (report.valid() ? "valid" : "invalid")};
        for (const auto& v : report.violations) header.push_back("violation [" + std::string(v.rule->id) + "] " + v.text());
        for (const auto& n : report.notes) header.push_back("applied [" + std::string(n.rule->id) + "] " + n.text());
        std::cout << capscope::emit_cpp_translation_unit(emitted, header) << capscope::check::inference_graphs_cpp(graphs);
    } else {
        std::cout << capscope::check::to_text(line, report, verbose) << capscope::check::inference_graphs_text(graphs)
                  << capscope::check::pipeline_schedule_text(line.pipeline);
    }
    return report.valid() && line.refused_inputs.empty() ? 0 : 1;
}

} // namespace

//! Anything thrown past the checks above (a bad_alloc, a filesystem error) is this input's usage
//! error, said as such, never an abort (a tree's inputs each catch their own in check_input).
int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "capscope-check: error: " << e.what() << "\n";
        return 2;
    }
}
