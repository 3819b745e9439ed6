// Megatron's dynamic-batching CUDA graphs, recorded from Megatron itself (d98e8a64dd, on the GPU
// machine where torch runs: tools/conformance/megatron_inference_graphs.py): capscope's port
// (rules/inference_graphs.hpp) builds the same batch dimensions and token counts, or rejects the
// same inputs, case for case.

#include <capscope/rules/inference_graphs.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <string>
#include <vector>

using namespace capscope;

TEST_CASE("Megatron's inference CUDA graphs, recorded from d98e8a64dd, match capscope's derivation case for case") {
    std::ifstream in(CAPSCOPE_UNIT_DATA "/megatron_inference_graphs.jsonl");
    REQUIRE(in.good());
    int cases = 0, agree = 0, rejected = 0;
    for (std::string line; std::getline(in, line);) {
        const auto c = nlohmann::json::parse(line);
        inference_graph_inputs x;
        x.tp_size = c["tp_size"];
        x.num_cuda_graphs = c["num_cuda_graphs"].get<int>();
        x.cuda_graph_max_tokens = c["cuda_graph_max_tokens"];
        x.cuda_graph_all_prefills = c["cuda_graph_all_prefills"];
        x.max_requests = c["max_requests"].get<int>();
        if (!c["max_tokens"].is_null()) x.max_tokens = c["max_tokens"].get<int>();
        x.max_sequence_length = c["max_sequence_length"];
        x.num_speculative_tokens = c["num_speculative_tokens"];
        x.mixed_prefill_count = c["mixed_prefill_count"];
        x.decode_only = c["decode_only"];
        x.sizing = c["sizing"] == "linear" ? bucket_sizing::linear : bucket_sizing::exponential;
        ++cases;
        bool same = false;
        std::string got_text;
        try {
            const inference_graphs g = megatron_inference_graphs(x);
            std::vector<std::array<int, 3>> dims;
            for (const batch_dimension& d : g.dimensions) dims.push_back({d.token_count, d.prefill_requests, d.decode_requests});
            std::sort(dims.begin(), dims.end());
            got_text = nlohmann::json{{"dimensions", dims}, {"token_counts", g.token_counts}}.dump();
            same = !c.contains("error") && nlohmann::json(dims) == c["dimensions"] && nlohmann::json(g.token_counts) == c["token_counts"];
        } catch (const std::invalid_argument& e) {
            got_text = std::string("rejects: ") + e.what();
            same = c.contains("error"); // Megatron's assertion fires too
            rejected += same;
        }
        CHECK_MESSAGE(same, line, "\n  capscope: ", got_text);
        agree += same;
    }
    MESSAGE(agree << " of " << cases << " cases agree (" << rejected << " rejected by both)");
    CHECK(cases == 1500);
}

TEST_CASE("without max_requests the graphs cannot be known from a command line, and capscope says so") {
    inference_graph_inputs x; // --inference-dynamic-batching-max-requests not given: sized from GPU memory
    CHECK_THROWS_WITH_AS(megatron_inference_graphs(x), "capscope: max_requests is sized from GPU memory at start-up; give --inference-dynamic-batching-max-requests",
                         std::invalid_argument);
    x.max_requests = 64;
    const inference_graphs g = megatron_inference_graphs(x);
    CHECK(g.max_tokens == 16384);          // Megatron's default context budget
    CHECK(g.cuda_graph_max_tokens == 512); // --inference-cuda-graph-max-tokens' default, above the decode bound 64
    CHECK(g.decode_batch_sizes().back() == 64);
}
