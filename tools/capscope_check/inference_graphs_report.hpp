#pragma once
// The CUDA graphs Megatron-LM would build for dynamic-batching inference from this command line
// (capscope/rules/inference_graphs.hpp), for the text, JSON and --emit-cpp outputs. Shown when the
// line is about dynamic batching (--inference-dynamic-batching, or any input of the derivation).

#include <capscope/flags/from_megatron_flags.hpp>
#include <capscope/rules/inference_graphs.hpp>
#include <capscope/validate.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace capscope::check {

struct inference_graph_section {
    bool shown = false;                     //!< the line is about dynamic batching
    inference_graph_inputs inputs;
    std::optional<inference_graphs> graphs; //!< when they can be known
    std::string not_known;                  //!< why they cannot be known from the line
    std::string megatron_stops;             //!< Megatron's start-up assertion that would fail
};

inference_graph_section derive_inference_graphs(const flags::megatron_command_line& line, const validation_report& report);
std::string inference_graphs_text(const inference_graph_section& s);
nlohmann::json inference_graphs_json(const inference_graph_section& s);
//! C++ lines for --emit-cpp: the decode graphs' sizes as `megatron_buckets<...>`, checked by the compiler.
std::string inference_graphs_cpp(const inference_graph_section& s);

} // namespace capscope::check
