// Zero overhead, measured: capscope's runner against hand-written code that captures the same
// segments with raw CUDA calls and launches them in a loop, and against eager execution, on the
// example model (bf16, hidden 512, seq 128, batch 1, 24 layers; dense and a mixed
// dense/MoE/Mamba pattern). Per variant: device time per step (CUDA events, median), host
// time per step (the enqueueing call, median), CUDA runtime API calls per step, and launches per
// step through the runtime and the driver (cuBLAS launches through the driver) (CUPTI).
// Variants run round-robin in one process, so drift hits them alike; the ratios are the result.
//
//   runner_overhead [--rounds R] [--steps-per-round K] [--markdown FILE] [--csv FILE]
//
// Exits 77 without a GPU.

#include "api_counter.hpp"
#include "arguments.hpp"
#include "figures_csv.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

struct variant {
    variant(std::string n, std::function<void(cudaStream_t)> f) : name(std::move(n)), step(std::move(f)) {}
    std::string name;
    std::function<void(cudaStream_t)> step; // set-up (captures) happens in the warm-up steps
    std::vector<float> device_ms, host_us;
    bench::api_calls api;
};

using bench::median;

//! Hand-written per-layer graphs: one graph per layer for its forward, one for its backward,
//! captured with raw CUDA calls; embedding, head, zeroing and the optimizer run eagerly.
class hand_written_per_layer {
public:
    explicit hand_written_per_layer(gpt::gpt_model<T>& m) : m_(m) {}
    void step(cudaStream_t s) {
        if (forward_.empty()) capture(s);
        const auto& st = m_.stages(0);
        m_.zero_grad(s);
        st.front().forward(s);
        for (cudaGraphExec_t g : forward_) CAPSCOPE_CHECK(cudaGraphLaunch(g, s));
        st.back().forward(s);
        st.back().backward(s);
        for (cudaGraphExec_t g : backward_) CAPSCOPE_CHECK(cudaGraphLaunch(g, s));
        st.front().backward(s);
        m_.optimizer_step(s);
    }
    ~hand_written_per_layer() {
        for (auto g : forward_) cudaGraphExecDestroy(g);
        for (auto g : backward_) cudaGraphExecDestroy(g);
    }

private:
    cudaGraphExec_t capture_range(cudaStream_t s, std::size_t first, std::size_t last, bool forward) {
        const auto& st = m_.stages(0);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CAPSCOPE_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        if (forward)
            for (std::size_t i = first; i < last; ++i) st[i].forward(s);
        else
            for (std::size_t i = last; i-- > first;) st[i].backward(s);
        CAPSCOPE_CHECK(cudaStreamEndCapture(s, &graph));
        CAPSCOPE_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CAPSCOPE_CHECK(cudaGraphDestroy(graph));
        return exec;
    }
    void capture(cudaStream_t s) {
        const auto& st = m_.stages(0);
        std::vector<std::pair<std::size_t, std::size_t>> layers; // [first, last) of each layer
        for (std::size_t i = 1; i + 1 < st.size();) {
            std::size_t j = i + 1;
            while (j + 1 < st.size() && st[j].layer == st[i].layer) ++j;
            layers.push_back({i, j});
            i = j;
        }
        for (const auto& [a, b] : layers) forward_.push_back(capture_range(s, a, b, true));
        for (auto it = layers.rbegin(); it != layers.rend(); ++it) backward_.push_back(capture_range(s, it->first, it->second, false));
    }
    gpt::gpt_model<T>& m_;
    std::vector<cudaGraphExec_t> forward_, backward_;
};

//! Hand-written whole step: one graph of zeroing, forward, backward and the optimizer.
class hand_written_whole {
public:
    explicit hand_written_whole(gpt::gpt_model<T>& m) : m_(m) {}
    void step(cudaStream_t s) {
        if (!exec_) {
            cudaGraph_t graph = nullptr;
            CAPSCOPE_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            m_.zero_grad(s);
            m_.forward(s);
            m_.backward(s);
            m_.optimizer_step(s);
            CAPSCOPE_CHECK(cudaStreamEndCapture(s, &graph));
            CAPSCOPE_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
            CAPSCOPE_CHECK(cudaGraphDestroy(graph));
        }
        CAPSCOPE_CHECK(cudaGraphLaunch(exec_, s));
    }
    ~hand_written_whole() {
        if (exec_) cudaGraphExecDestroy(exec_);
    }

private:
    gpt::gpt_model<T>& m_;
    cudaGraphExec_t exec_ = nullptr;
};

// The model facts of each pattern (24 layers): the runner checks them against the program (P10).
using dense_facts = model<layers<24>>;
using mixed_facts = model<layers<24>, experts<8>, capacity_factor<1.0>, pad_to_capacity,
                          moe_pattern<0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0>>;

struct options {
    int layers = 24; // the configs state it: model<layers<24>>
    int rounds = 12, steps_per_round = 20;
    std::string markdown, csv;
};

template <class Facts>
std::string run_pattern(const std::string& label, const std::string& pattern, const options& o, bench::figures_csv& csv, cudaStream_t s) {
    using local_cfg = config<impl::lazy_per_layer, modules<>, Facts, warmup_steps<2>>;
    using te_cfg = config<impl::ahead_of_time_per_layer, modules<>, Facts, warmup_steps<2>>;
    using full_cfg = config<impl::whole_iteration, Facts, no_nan_check, warmup_steps<2>>;
    using none_cfg = config<impl::eager, Facts>;
    gpt::model_config cfg;
    cfg.vocab = 1024;
    cfg.hidden = 512;
    cfg.heads = 8;
    cfg.ffn_hidden = 2048;
    cfg.seq_len = 128;
    cfg.batch = 1;
    cfg.layer_pattern = pattern;
    cfg.experts = 8;
    cfg.top_k = 2;
    cfg.capacity_factor = 1.0;
    cfg.moe_mode = gpt::moe_mode::drop_and_pad;
    gpt::gpt_model<T> m(cfg, s);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(0, cfg.vocab - 1);
    std::vector<int> tokens(std::size_t(cfg.tokens())), labels(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng);
    for (std::size_t i = 0; i < tokens.size(); ++i) labels[i] = i + 1 < tokens.size() ? tokens[i + 1] : -1;
    m.set_batch(tokens, labels, s);

    runner<none_cfg> none(m.training_program());
    runner<local_cfg> local(m.training_program());
    runner<te_cfg> te(m.training_program());
    runner<full_cfg> full(m.training_program());
    hand_written_per_layer hand_layers(m), hand_layers_again(m);
    hand_written_whole hand_whole(m);

    std::vector<variant> v;
    v.emplace_back("eager (direct calls)", [&](cudaStream_t st) {
        m.zero_grad(st);
        m.forward(st);
        m.backward(st);
        m.optimizer_step(st);
    });
    v.emplace_back("eager (direct calls), 2nd copy", [&](cudaStream_t st) { // the noise of eager timing
        m.zero_grad(st);
        m.forward(st);
        m.backward(st);
        m.optimizer_step(st);
    });
    v.emplace_back("runner none", [&](cudaStream_t st) { none.step(st); });
    v.emplace_back("hand-written per-layer graphs", [&](cudaStream_t st) { hand_layers.step(st); });
    // A second copy of the reference: the spread between the two is the noise of this run.
    v.emplace_back("hand-written per-layer graphs, 2nd copy", [&](cudaStream_t st) { hand_layers_again.step(st); });
    v.emplace_back("runner local", [&](cudaStream_t st) { local.step(st); });
    v.emplace_back("runner transformer_engine", [&](cudaStream_t st) { te.step(st); });
    v.emplace_back("hand-written whole-step graph", [&](cudaStream_t st) { hand_whole.step(st); });
    v.emplace_back("runner full_iteration", [&](cudaStream_t st) { full.step(st); });

    // Warm up: module loading, cuBLAS heuristics, the runners' warmup steps and captures.
    for (auto& x : v)
        for (int i = 0; i < 4; ++i) x.step(s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));

    bench::time_round_robin(v, o.rounds, o.steps_per_round, s);
    bench::api_counter counter;
    for (auto& x : v) {
        x.api = counter.count([&] { x.step(s); });
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    }

    auto find = [&](const std::string& name) -> const variant& {
        for (const auto& x : v)
            if (x.name == name) return x;
        throw std::logic_error(name);
    };
    const variant& per_layer_ref = find("hand-written per-layer graphs");
    const variant& whole_ref = find("hand-written whole-step graph");
    const variant& eager_ref = find("eager (direct calls)");
    std::string table = "\n### " + label + " (`" + pattern + "`, " + std::to_string(m.parameters().total()) + " parameters)\n\n";
    table += "| variant | device ms/step (median) | host µs/step (median) | runtime API calls/step | launches/step | device vs its reference | host vs its reference | API calls vs its reference |\n";
    table += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
    const std::string what = label + " (" + pattern + ")";
    for (const auto& x : v) {
        csv.row("runner overhead", what, x.name, "device_ms", median(x.device_ms));
        csv.row("runner overhead", what, x.name, "host_us", median(x.host_us));
        csv.row("runner overhead", what, x.name, "runtime_api_calls", double(bench::api_counter::total(x.api.runtime)));
        csv.row("runner overhead", what, x.name, "launches", double(x.api.launches));
        const variant& ref = x.name.find("full_iteration") != std::string::npos || x.name.find("whole-step") != std::string::npos
                                 ? whole_ref
                             : x.name.find("local") != std::string::npos || x.name.find("transformer_engine") != std::string::npos ||
                                       x.name.find("per-layer") != std::string::npos
                                 ? per_layer_ref
                                 : eager_ref;
        char row[512];
        std::snprintf(row, sizeof row, "| %s | %.3f | %.1f | %ld | %ld | %.3f (%s) | %.3f | %ld vs %ld |\n", x.name.c_str(), median(x.device_ms),
                      median(x.host_us), bench::api_counter::total(x.api.runtime), x.api.launches, median(x.device_ms) / median(ref.device_ms),
                      ref.name == "eager (direct calls)" ? "eager" : ref.name == "hand-written whole-step graph" ? "hand whole" : "hand per-layer",
                      median(x.host_us) / median(ref.host_us), bench::api_counter::total(x.api.runtime), bench::api_counter::total(ref.api.runtime));
        table += row;
    }
    table += "\nAPI calls per step, by function (runtime; then driver calls made directly, cuBLAS's launches among them):\n\n";
    for (const auto& x : v) {
        table += "- " + x.name + ":" + x.api.by_function() + "\n";
    }
    char ratio[256];
    std::snprintf(ratio, sizeof ratio, "\nPer-layer graphs vs eager: %.2fx faster; whole step vs eager: %.2fx faster.\n",
                  median(eager_ref.device_ms) / median(per_layer_ref.device_ms), median(eager_ref.device_ms) / median(whole_ref.device_ms));
    table += ratio;
    return table;
}

} // namespace

int main(int argc, char** argv) {
    options o;
    bench::arguments("runner_overhead")
        .integer("--rounds", o.rounds, 1)
        .integer("--steps-per-round", o.steps_per_round, 1)
        .text("--markdown", o.markdown)
        .text("--csv", o.csv)
        .parse_or_exit(argc, argv);
    if (capscope::cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return capscope::cuda::skip_exit_code;
    }
    try {
        cudaDeviceProp prop{};
        CAPSCOPE_CHECK(cudaGetDeviceProperties(&prop, 0));
        capscope::cuda::stream s;
        std::string report = "Device: " + std::string(prop.name) + "; " + std::to_string(o.rounds) + " rounds x " +
                             std::to_string(o.steps_per_round) + " steps per variant, round-robin.\n";
        std::string dense(std::size_t(o.layers), 'D'), mixed;
        for (int i = 0; i < o.layers / 4; ++i) mixed += "DEDM";
        bench::figures_csv csv(o.csv);
        report += run_pattern<dense_facts>("dense", dense, o, csv, s);
        report += run_pattern<mixed_facts>("mixed dense/MoE (drop-and-pad)/Mamba", mixed, o, csv, s);
        std::fputs(report.c_str(), stdout);
        if (!o.markdown.empty()) std::ofstream(o.markdown) << report;
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "runner_overhead: %s\n", e.what());
        return 1;
    }
}
