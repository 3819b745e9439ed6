#pragma once
// --from-yaml FILE: the MODEL_ARGS mapping of a Megatron-LM functional-test config, turned into a
// command line the way its launcher does it: `--flag: true` is the bare flag, `false` (or null)
// leaves it out, a sequence `[a, b, c]` is a list of values, any other scalar is one value
// (a parenthesized "(...)" string stays one value, and ${VAR} stays as written).

#include <string>
#include <utility>
#include <vector>

namespace capscope::check {

//! A MODEL_ARGS mapping read as a command line, with where each flag stands in the file.
struct yaml_model_args {
    std::vector<std::string> args;                      //!< in the mapping's order
    std::vector<std::pair<std::string, int>> key_lines; //!< each --flag key and its line (1-based)
    int model_args_line = 1;                            //!< the line of the MODEL_ARGS key
};

//! Throws capscope::flags::flag_error naming the file and line.
yaml_model_args read_model_args(const std::string& path);

//! The arguments only.
inline std::vector<std::string> model_args_from_yaml(const std::string& path) { return read_model_args(path).args; }

} // namespace capscope::check
