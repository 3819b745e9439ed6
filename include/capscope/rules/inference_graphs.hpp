#pragma once
//! @file
//! The CUDA graphs Megatron-LM captures for dynamic-batching inference, derived from its
//! command line as Megatron derives them at start-up (commit d98e8a64dd):
//! `DynamicInferenceContext.__init__` clamps the graph token budget,
//! `CUDAGraphBatchDimensionBuilder.generate_cuda_graph_batch_dimensions_list` builds the batch
//! dimensions (token count, prefill requests, decode requests) from the token counts of
//! `_calculate_cuda_graph_token_counts` (`megatron_cuda_graph_batch_sizes`, rules/batch_sizes.hpp).
//!
//! What cannot be known from a command line: without `--inference-dynamic-batching-max-requests`
//! Megatron sizes `max_requests` from the KV-cache memory it finds on the GPU at start-up, and every
//! graph depends on it. Batch-invariant mode (64-token alignment) is not modelled.

#include <capscope/rules/batch_sizes.hpp>

#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope {

//! The inputs of the derivation, with Megatron's defaults.
struct inference_graph_inputs {
    int tp_size = 1;                           //!< --tensor-model-parallel-size
    std::optional<int> num_cuda_graphs = 16;   //!< --inference-dynamic-batching-num-cuda-graphs; nullopt: graphs off
    int cuda_graph_max_tokens = 512;           //!< --inference-cuda-graph-max-tokens
    bool cuda_graph_all_prefills = false;      //!< --inference-cuda-graph-all-prefills
    std::optional<int> max_requests;           //!< --inference-dynamic-batching-max-requests; nullopt: sized from GPU memory
    std::optional<int> max_tokens;             //!< --inference-dynamic-batching-max-tokens; nullopt (or 0): 16384
    int max_sequence_length = 2560;            //!< --inference-max-seq-length
    int num_speculative_tokens = 0;            //!< --num-speculative-tokens
    int mixed_prefill_count = 16;              //!< --inference-dynamic-batching-cuda-graph-mixed-prefill-count
    bool decode_only = false;                  //!< decode_only_cuda_graphs (no graphs for steps with prefill)
    bucket_sizing sizing = bucket_sizing::exponential; //!< --inference-dynamic-batching-cuda-graph-sizing-distribution
};

//! One captured shape: Megatron's `InferenceBatchDimensions`.
struct batch_dimension {
    int token_count = 0, prefill_requests = 0, decode_requests = 0;
    friend constexpr bool operator==(const batch_dimension&, const batch_dimension&) = default;
};

struct inference_graphs {
    int max_tokens = 0;            //!< the context's token budget
    int cuda_graph_max_tokens = 0; //!< after Megatron's clamps
    int decode_max_tokens = 0;     //!< min(cuda_graph_max_tokens, max_requests * (speculative + 1))
    int num_cuda_graphs = 0;       //!< after Megatron's clamp (-1: automatic)
    std::vector<int> prefill_token_counts; //!< ascending
    std::vector<int> decode_token_counts;  //!< ascending (automatic sizing adds the smallest decode shapes)
    std::vector<batch_dimension> dimensions; //!< Megatron's order: most prefill tokens first
    std::vector<int> token_counts;           //!< the distinct token counts of `dimensions`, descending
    //! The decode-only graphs' batch sizes (requests per decode step), ascending.
    std::vector<int> decode_batch_sizes() const {
        std::vector<int> out;
        for (const batch_dimension& d : dimensions)
            if (d.prefill_requests == 0) out.push_back(d.decode_requests);
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
    }
};

//! Megatron's derivation; needs `max_requests`. Throws `std::invalid_argument` with Megatron's
//! words where its start-up assertions fail.
inline inference_graphs megatron_inference_graphs(const inference_graph_inputs& in) {
    if (!in.max_requests)
        throw std::invalid_argument("capscope: max_requests is sized from GPU memory at start-up; give --inference-dynamic-batching-max-requests");
    const long long tp = in.tp_size, spec_unit = in.num_speculative_tokens + 1;
    const int max_requests = *in.max_requests;
    if (tp < 1) throw std::invalid_argument("capscope: tensor_model_parallel_size must be >= 1");
    if (max_requests % in.tp_size != 0)
        throw std::invalid_argument("max_requests must be divisible by tp_size (" + std::to_string(in.tp_size) + "), but got " +
                                    std::to_string(max_requests));
    inference_graphs out;
    out.max_tokens = in.max_tokens.value_or(0) ? *in.max_tokens : 16384; // DynamicInferenceContext.DEFAULT_MAX_TOKENS
    const long long decode_bound = max_requests * spec_unit;
    long long cgmt = in.cuda_graph_all_prefills ? out.max_tokens
                                                : std::min<long long>(std::max<long long>(in.cuda_graph_max_tokens, decode_bound), out.max_tokens);
    if (!in.num_cuda_graphs) return out; // graphs off
    if (cgmt > out.max_tokens || cgmt <= 0) cgmt = out.max_tokens;
    if (cgmt < decode_bound)
        throw std::invalid_argument("cuda_graph_max_tokens (" + std::to_string(cgmt) + ") must be >= max_requests * (num_speculative_tokens + 1) (" +
                                    std::to_string(decode_bound) + ")");
    int n = *in.num_cuda_graphs;
    if (n != -1) n = int(std::min<long long>(std::max(n, 1), cgmt));
    out.cuda_graph_max_tokens = int(cgmt);
    out.num_cuda_graphs = n;
    out.prefill_token_counts = megatron_cuda_graph_token_counts(n, int(cgmt), in.tp_size, in.sizing);
    out.decode_max_tokens = int(std::min(cgmt, decode_bound));
    out.decode_token_counts = megatron_cuda_graph_token_counts(n, out.decode_max_tokens, in.tp_size, in.sizing);
    if (n == -1) { // the smallest decode shapes, which TP alignment can drop
        const long long unit = std::lcm(spec_unit, tp);
        for (long long k : {1LL, 2LL})
            if (unit * k <= out.decode_max_tokens) out.decode_token_counts.push_back(int(unit * k));
        std::sort(out.decode_token_counts.begin(), out.decode_token_counts.end());
        out.decode_token_counts.erase(std::unique(out.decode_token_counts.begin(), out.decode_token_counts.end()), out.decode_token_counts.end());
    }

    auto add_if_valid = [&](long long tokens, long long prefill, long long decode_requests) {
        if (tokens <= 0 || prefill + decode_requests > max_requests || prefill < 0 || decode_requests < 0) return;
        if (tokens < prefill + decode_requests * spec_unit) return;
        if (tokens > prefill * in.max_sequence_length + decode_requests * spec_unit) return;
        const batch_dimension d{int(tokens), int(prefill), int(decode_requests)};
        if (std::find(out.dimensions.begin(), out.dimensions.end(), d) == out.dimensions.end()) out.dimensions.push_back(d);
    };
    const bool mixed = in.mixed_prefill_count > 0 && !in.decode_only;
    if (mixed) {
        std::vector<long long> p_values;
        long long prefill_only_floor = 1;
        if (in.sizing == bucket_sizing::linear) {
            p_values = {std::min<long long>(in.mixed_prefill_count, max_requests)};
            prefill_only_floor = in.mixed_prefill_count;
        } else {
            for (long long p = 1; p < max_requests; p *= 2) p_values.push_back(p);
            if (p_values.empty() || p_values.back() != max_requests) p_values.push_back(max_requests);
        }
        for (auto it = out.prefill_token_counts.rbegin(); it != out.prefill_token_counts.rend(); ++it) {
            const int size = *it;
            for (long long p : p_values) {
                const long long d = std::max(0LL, std::min((size - p) / spec_unit, max_requests - p));
                if (size < 2) continue;
                add_if_valid(size, p, d);
            }
            const long long minimal = std::max<long long>(prefill_only_floor, detail::ceil_div(size, std::max(1, in.max_sequence_length - 1)));
            if (minimal < max_requests && size >= 2) add_if_valid(size, std::max(minimal, std::min<long long>(max_requests, size)), 0);
        }
    }
    for (auto it = out.decode_token_counts.rbegin(); it != out.decode_token_counts.rend(); ++it) {
        const int size = *it;
        const long long d = std::min<long long>(size / spec_unit, max_requests);
        add_if_valid(d * spec_unit / tp * tp, 0, d);
    }
    std::stable_sort(out.dimensions.begin(), out.dimensions.end(), [&](const batch_dimension& a, const batch_dimension& b) {
        const long long pa = a.token_count - a.decode_requests * spec_unit, pb = b.token_count - b.decode_requests * spec_unit;
        return pa != pb ? pa > pb : a.decode_requests > b.decode_requests;
    });
    for (const batch_dimension& d : out.dimensions) out.token_counts.push_back(d.token_count);
    std::sort(out.token_counts.begin(), out.token_counts.end(), std::greater<>());
    out.token_counts.erase(std::unique(out.token_counts.begin(), out.token_counts.end()), out.token_counts.end());
    return out;
}

} // namespace capscope
