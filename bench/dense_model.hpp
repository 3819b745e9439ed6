#pragma once
// bench/same_model's dense model (vocab 256, heads of 64, ffn 4 x hidden, sequence 2048), and
// random batches for it: what bench/finite_check and bench/graph_cost time.

#include <gpt/model.hpp>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

namespace bench {

inline gpt::model_config dense_model(int hidden, int batch, int layers, int microbatches = 1) {
    gpt::model_config c;
    c.vocab = 256;
    c.hidden = hidden;
    c.heads = hidden / 64;
    c.ffn_hidden = 4 * hidden;
    c.seq_len = 2048;
    c.batch = batch;
    c.microbatches = microbatches;
    c.layer_pattern = std::string(std::size_t(layers), 'D');
    return c;
}

//! Random tokens and labels in every microbatch's input buffers (no learnable task: timing only).
template <class T> void random_batches(gpt::gpt_model<T>& model, unsigned seed, cudaStream_t s) {
    std::mt19937 rng(seed);
    const auto t = static_cast<std::size_t>(model.config().tokens());
    for (int mb = 0; mb < model.config().microbatches; ++mb) {
        std::vector<int> tokens(t), labels(t);
        for (std::size_t i = 0; i < t; ++i) tokens[i] = int(rng() % 256), labels[i] = int(rng() % 256);
        model.set_batch(mb, tokens, labels, s);
    }
}

} // namespace bench
