#pragma once
// Many inputs in one run: each YAML config (a file, every model_config.yaml under a directory,
// or the files a glob pattern matches) and, with --each, each @argument file is checked on its
// own. One verdict per input, then a summary; the exit status is the worst one.

#include <capscope/flags/from_megatron_flags.hpp>
#include <capscope/validate.hpp>

#include <string>
#include <utility>
#include <vector>

namespace capscope::check {

//! One thing to check.
struct input {
    enum class kind { yaml, argument_file } source = kind::yaml;
    std::string path;
    std::string error; //!< set when the path named no file (a usage error for this input)
};

//! Expands --from-yaml values: a file is one input; a directory, every `model_config.yaml` below
//! it (sorted; links to directories are not followed); a pattern with * ? or [ ], the files it
//! matches (sorted). A value that names nothing, a directory or entry below that cannot be read
//! and a model_config.yaml that is no readable file are each an input with an error.
std::vector<input> expand_yaml_inputs(const std::vector<std::string>& values);

//! What checking one input gave.
struct input_result {
    std::string path;
    int status = 0;    //!< 0 valid, 1 invalid, 2 usage error
    std::string error; //!< the usage error
    int error_line = 0;
    flags::megatron_command_line line;
    validation_report report;
    std::vector<std::pair<std::string, int>> key_lines; //!< YAML: each --flag key and its line
    int model_args_line = 1;
};

//! Checks one input; `extra` (the plain flags of the command line) comes after the input's own.
input_result check_input(const input& in, const std::vector<std::string>& extra, const flags::parse_options& options);

//! The line of the key a violation is about: the first MODEL_ARGS key whose Megatron name the
//! rule's statement or message mentions, else the MODEL_ARGS line.
int offending_line(const input_result& r, const finding& f);

//! "PATH: VALID", "PATH: INVALID: [S2] message -- fix: ...", "PATH: USAGE ERROR: ...".
std::string verdict_line(const input_result& r);
//! A GitHub Actions annotation for an invalid input or a usage error ("" for a valid one).
std::string github_annotation(const input_result& r);
//! "N inputs: a valid, b invalid, c usage errors".
std::string summary_line(const std::vector<input_result>& results);

} // namespace capscope::check
