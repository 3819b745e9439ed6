#pragma once
// What the tutorials share: the reverse task (8 symbols, a separator, the same symbols
// reversed; the loss is on the reversed half), step timing with CUDA events, and printing a
// runner's counters and plan.

#include <gpt/model.hpp>

#include <capscope/cuda/event.hpp>
#include <capscope/run/counters.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace tutorial {

constexpr int symbols = 8, separator = 1, first_symbol = 2;

//! A model config for the reverse task: sequences of 2 * symbols tokens.
inline gpt::model_config reverse_task_model(const std::string& pattern, int hidden, int batch, int microbatches) {
    gpt::model_config cfg;
    cfg.vocab = first_symbol + 14;
    cfg.hidden = hidden;
    cfg.heads = 4;
    cfg.ffn_hidden = 2 * hidden;
    cfg.seq_len = 2 * symbols;
    cfg.batch = batch;
    cfg.microbatches = microbatches;
    cfg.layer_pattern = pattern;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.capacity_factor = 1.5;
    return cfg;
}

//! Writes a fresh batch of the reverse task into every microbatch's input buffers.
template <class T> void feed(gpt::gpt_model<T>& model, std::mt19937& rng, cudaStream_t s) {
    const auto& cfg = model.config();
    std::uniform_int_distribution<int> sym(first_symbol, cfg.vocab - 1);
    for (int mb = 0; mb < cfg.microbatches; ++mb) {
        std::vector<int> tokens, labels;
        for (int n = 0; n < cfg.batch; ++n) {
            std::vector<int> seq(symbols);
            for (int& x : seq) x = sym(rng);
            std::vector<int> full = seq;
            full.push_back(separator);
            full.insert(full.end(), seq.rbegin(), seq.rend());
            for (int i = 0; i < cfg.seq_len; ++i) {
                tokens.push_back(full[std::size_t(i)]);
                labels.push_back(i >= symbols ? full[std::size_t(i) + 1] : -1);
            }
        }
        model.set_batch(mb, tokens, labels, s);
    }
}

//! Median milliseconds of device time per step over `n` steps of `step()` (after `feed`).
template <class T, class Step> double median_step_ms(gpt::gpt_model<T>& model, std::mt19937& rng, cudaStream_t s, int n, Step&& step) {
    auto start = capscope::cuda::event::timing(), stop = capscope::cuda::event::timing();
    std::vector<float> ms;
    for (int i = 0; i < n; ++i) {
        feed(model, rng, s);
        start.record(s);
        step();
        stop.record(s);
        stop.synchronize();
        ms.push_back(capscope::cuda::event::elapsed_ms(start, stop));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

inline void print_counters(const char* what, const capscope::runner_counters& c) {
    std::printf("counters (%s): %ld steps, %ld captures, %ld instantiations, %ld replays, %ld eager segment runs, %ld capture failures",
                what, c.steps, c.captures, c.instantiations, c.replays, c.eager_segment_runs, c.capture_failures);
    if (c.reruns) std::printf(", %ld steps refused and rerun eagerly", c.reruns); // a static dropless capacity (tutorial 04)
    std::printf("\n");
}

//! Writes the plan's DOT to `path` when one was given (render it with `dot -Tsvg`).
inline void write_dot(const std::string& path, const std::string& dot) {
    if (path.empty()) return;
    std::ofstream(path) << dot;
    std::printf("plan written to %s (render: dot -Tsvg %s -o plan.svg)\n", path.c_str(), path.c_str());
}

//! The tutorials' command line: [--dot FILE] (tutorial 04 takes one per plan, three in all).
struct arguments {
    std::vector<std::string> dot;
};
inline arguments parse(int argc, char** argv, const char* usage) {
    arguments a;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--dot" && i + 1 < argc) a.dot.push_back(argv[++i]);
        else {
            std::fprintf(stderr, "%s\n", usage);
            std::exit(2);
        }
    }
    return a;
}

} // namespace tutorial
