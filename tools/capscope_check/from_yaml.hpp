#pragma once
// --from-yaml FILE: the MODEL_ARGS mapping of a Megatron-LM functional-test config, turned into a
// command line the way its launcher does it: `--flag: true` is the bare flag, `false` (or null)
// leaves it out, a sequence `[a, b, c]` is a list of values, any other scalar is one value
// (a parenthesized "(...)" string stays one value, and ${VAR} stays as written).

#include <string>
#include <vector>

namespace capscope::check {

//! The arguments, in the mapping's order; throws capscope::flags::flag_error naming the file and line.
std::vector<std::string> model_args_from_yaml(const std::string& path);

} // namespace capscope::check
