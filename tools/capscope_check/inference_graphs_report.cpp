#include "inference_graphs_report.hpp"

#include <capscope/flags/python_values.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

namespace capscope::check {

namespace {
constexpr const char* inputs_dests[] = {
    "inference_dynamic_batching_num_cuda_graphs", "inference_cuda_graph_max_tokens", "inference_cuda_graph_all_prefills",
    "inference_dynamic_batching_max_requests",    "inference_dynamic_batching_max_tokens", "num_speculative_tokens",
    "inference_dynamic_batching_cuda_graph_mixed_prefill_count", "inference_dynamic_batching_cuda_graph_sizing_distribution",
    "decode_only_cuda_graphs"};

//! A value past the int the derivation works in (Python's ints have no bound).
struct beyond_int {
    std::string_view dest;
    std::string value;
};

//! The flag's value read as Python's int() reads it ("1_000" is 1000), as the flag parser checked it.
std::optional<int> int_of(const flags::megatron_command_line& line, std::string_view dest) {
    const auto* g = line.find(dest);
    if (!g || g->values.empty()) return std::nullopt;
    const std::optional<long long> v = flags::detail::python_int(g->values.front());
    if (!v || !flags::detail::fits_int(*v)) throw beyond_int{dest, g->values.front()};
    return int(*v);
}
bool given(const flags::megatron_command_line& line, std::string_view dest) { return line.find(dest) != nullptr; }

void read_inputs(const flags::megatron_command_line& line, inference_graph_inputs& in) {
    in.tp_size = int_of(line, "tensor_model_parallel_size").value_or(1);
    in.num_cuda_graphs = int_of(line, "inference_dynamic_batching_num_cuda_graphs").value_or(16);
    in.cuda_graph_max_tokens = int_of(line, "inference_cuda_graph_max_tokens").value_or(512);
    in.cuda_graph_all_prefills = given(line, "inference_cuda_graph_all_prefills");
    in.max_requests = int_of(line, "inference_dynamic_batching_max_requests");
    in.max_tokens = int_of(line, "inference_dynamic_batching_max_tokens");
    in.max_sequence_length = int_of(line, "inference_max_seq_length").value_or(2560);
    in.num_speculative_tokens = int_of(line, "num_speculative_tokens").value_or(0);
    in.mixed_prefill_count = int_of(line, "inference_dynamic_batching_cuda_graph_mixed_prefill_count").value_or(16);
    in.decode_only = given(line, "decode_only_cuda_graphs");
    if (const auto* g = line.find("inference_dynamic_batching_cuda_graph_sizing_distribution"); g && !g->values.empty())
        in.sizing = g->values.front() == "linear" ? bucket_sizing::linear : bucket_sizing::exponential;
}

const char* sizing_name(bucket_sizing s) { return s == bucket_sizing::linear ? "linear" : "exponential"; }
} // namespace

inference_graph_section derive_inference_graphs(const flags::megatron_command_line& line, const validation_report& report) {
    inference_graph_section s;
    s.shown = given(line, "inference_dynamic_batching");
    for (const char* d : inputs_dests) s.shown = s.shown || given(line, d);
    if (!s.shown) return s;
    inference_graph_inputs& in = s.inputs;
    try {
        read_inputs(line, in);
    } catch (const beyond_int& b) {
        std::string flag = "--" + std::string(b.dest);
        std::replace(flag.begin(), flag.end(), '_', '-');
        s.not_known = "not derived: " + flag + " " + b.value + " is past the int range (2^31 - 1) capscope derives the graphs in";
        return s;
    }
    // Megatron captures them only with an inference CUDA-graph scope (megatron/inference/utils.py).
    if (report.later_stages_skipped) {
        s.not_known = "the configuration does not normalize, so its inference scope is not known";
        return s;
    }
    if (report.normalized.inference.value_or(inference_scope::eager) == inference_scope::eager) {
        in.num_cuda_graphs = std::nullopt;
        s.not_known = "none: the inference CUDA-graph scope is none (graphs are off)";
        return s;
    }
    if (!in.max_requests) {
        s.not_known = "not known from the command line: Megatron sizes max_requests from the KV-cache memory it finds on the GPU at "
                      "start-up, and every graph depends on it -- give --inference-dynamic-batching-max-requests to see them";
        return s;
    }
    try {
        s.graphs = megatron_inference_graphs(in);
    } catch (const std::exception& e) {
        s.megatron_stops = e.what();
    }
    return s;
}

std::string inference_graphs_text(const inference_graph_section& s) {
    if (!s.shown) return "";
    std::string out = "\ninference CUDA graphs (dynamic batching, as Megatron derives them at start-up):\n";
    if (!s.megatron_stops.empty()) return out + "  Megatron would stop at start-up: " + s.megatron_stops + "\n";
    if (!s.graphs) return out + "  " + s.not_known + "\n";
    const inference_graphs& g = *s.graphs;
    out += fmt::format("  token budget {} (max_tokens), graph budget {} (clamped to [max_requests x (speculative + 1), max_tokens]), {} "
                       "graphs requested ({} sizing)\n",
                       g.max_tokens, g.cuda_graph_max_tokens, g.num_cuda_graphs, sizing_name(s.inputs.sizing));
    out += fmt::format("  decode graphs, batch sizes (requests): [{}]\n", fmt::join(g.decode_batch_sizes(), ", "));
    out += fmt::format("  token counts captured: [{}]\n", fmt::join(g.token_counts, ", "));
    out += fmt::format("  batch dimensions (tokens, prefill requests, decode requests): {} in all\n", g.dimensions.size());
    return out;
}

nlohmann::json inference_graphs_json(const inference_graph_section& s) {
    if (!s.shown) return nullptr;
    if (!s.megatron_stops.empty()) return {{"megatron_stops", s.megatron_stops}};
    if (!s.graphs) return {{"not_known", s.not_known}};
    const inference_graphs& g = *s.graphs;
    nlohmann::json dims = nlohmann::json::array();
    for (const batch_dimension& d : g.dimensions) dims.push_back({d.token_count, d.prefill_requests, d.decode_requests});
    return {{"max_tokens", g.max_tokens},
            {"cuda_graph_max_tokens", g.cuda_graph_max_tokens},
            {"num_cuda_graphs", g.num_cuda_graphs},
            {"sizing", sizing_name(s.inputs.sizing)},
            {"decode_batch_sizes", g.decode_batch_sizes()},
            {"token_counts", g.token_counts},
            {"batch_dimensions", dims}};
}

std::string inference_graphs_cpp(const inference_graph_section& s) {
    if (!s.graphs || s.graphs->num_cuda_graphs == -1) return ""; // automatic sizing adds shapes megatron_buckets<> does not
    const inference_graphs& g = *s.graphs;
    return fmt::format("\n// Megatron's decode CUDA graphs for this line, as capscope derives them: token counts [{}]\n"
                       "using megatron_decode_buckets = capscope::megatron_buckets<{}, {}, {}, capscope::bucket_sizing::{}>;\n"
                       "static_assert(megatron_decode_buckets::sizes == capscope::bucket_list{{{}}});\n",
                       fmt::join(g.decode_token_counts, ", "), g.num_cuda_graphs, g.decode_max_tokens, s.inputs.tp_size,
                       sizing_name(s.inputs.sizing), fmt::join(g.decode_token_counts, ", "));
}

} // namespace capscope::check
