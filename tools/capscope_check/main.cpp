// capscope-check: check a Megatron-LM CUDA-graph configuration before spending GPU hours.
//
//   capscope-check [--json | --emit-cpp] [--verbose] [--ignore-unknown-flags] [--from-yaml FILE] MEGATRON_FLAGS... [@ARGFILE]...
//   capscope-check --list-rules [--markdown]
//   capscope-check --version
//
// Exit status: 0 valid, 1 invalid, 2 usage error (including flags Megatron does not have).

#include "from_yaml.hpp"
#include "report.hpp"

#include <capscope/emit_cpp.hpp>
#include <capscope/flags/argument_file.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

namespace {

std::string quoted_command_line(const std::vector<std::string>& args) {
    std::string s;
    for (const auto& a : args) s += (s.empty() ? "" : " ") + a;
    return s;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"capscope-check: validate Megatron-LM CUDA-graph flags with capscope's rule table.\n"
                 "Pass the Megatron flags verbatim after the options below.",
                 "capscope-check"};
    bool json = false, verbose = false, emit_cpp = false, list_rules = false, markdown = false, ignore_unknown = false, version = false;
    std::string yaml_file;
    app.add_option("--from-yaml", yaml_file, "read the MODEL_ARGS mapping of a Megatron-LM functional-test YAML config "
                                             "(before any flags given on the command line)");
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
    if (version) {
        std::cout << "capscope-check " << CAPSCOPE_VERSION << "\nMegatron-LM flags: commit " << capscope::flags::megatron_commit << " ("
                  << capscope::flags::megatron_option_strings << " option strings)\n";
        return 0;
    }
    if (list_rules) {
        std::cout << (markdown ? capscope::check::rules_markdown() : capscope::check::rules_text());
        return 0;
    }

    std::vector<std::string> megatron_args;
    capscope::flags::megatron_command_line line;
    try {
        // The YAML's arguments come first, so flags on the command line win (argparse: last wins).
        if (!yaml_file.empty()) megatron_args = capscope::check::model_args_from_yaml(yaml_file);
        for (auto& a : capscope::flags::expand_argument_files(app.remaining())) megatron_args.push_back(std::move(a));
        line = capscope::flags::from_megatron_flags(megatron_args, {.ignore_unknown = ignore_unknown});
    } catch (const capscope::flags::flag_error& e) {
        std::cerr << "capscope-check: error: " << e.what() << "\n";
        return 2;
    }
    capscope::validation_report report = capscope::validate(line.config);

    if (json) {
        std::cout << capscope::check::to_json(line, report).dump(2) << "\n";
    } else if (emit_cpp) {
        // A configuration that normalizes is emitted as Megatron runs it (migrations and
        // adjustments applied); one that does not is emitted as written, so the compiler
        // rejects it for the same normalization rule.
        const capscope::runtime_config& emitted = report.later_stages_skipped ? line.config : report.normalized;
        std::vector<std::string> header{"From: " + quoted_command_line(megatron_args),
                                        std::string("capscope-check verdict: ") + (report.valid() ? "valid" : "invalid")};
        for (const auto& v : report.violations) header.push_back("violation [" + std::string(v.rule->id) + "] " + v.text());
        for (const auto& n : report.notes) header.push_back("applied [" + std::string(n.rule->id) + "] " + n.text());
        std::cout << capscope::emit_cpp_translation_unit(emitted, header);
    } else {
        std::cout << capscope::check::to_text(line, report, verbose);
    }
    return report.valid() ? 0 : 1;
}
