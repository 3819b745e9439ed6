// Inference graphs, measured side by side in one process:
//
// 1. Capture + instantiate against capture + exec update, for a 24-layer model (bf16, hidden
//    512, seq 128, batch 8): the whole forward as one graph (scope block) and 24 per-layer
//    graphs (scope layer), at the CUDA API (each call timed alone) and through the runner
//    (reset() + capture_all() against rebind() to the other input slot + capture_all()).
// 2. One inference forward, eager vs scope layer vs scope block, at batch 1, 8 and 64 on the
//    example model (bf16, hidden 512, seq 128, layers D E M D: dense, MoE drop-and-pad, Mamba).
//
//   inference [--rounds R] [--markdown FILE] [--csv FILE]        Exits 77 without a GPU.

#include "arguments.hpp"
#include "figures_csv.hpp"
#include "round_robin.hpp"

#include <gpt/inference.hpp>

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
#include <random>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;
using clock_type = std::chrono::steady_clock;

using bench::median;
template <class F> double host_us(F&& f) {
    const auto t0 = clock_type::now();
    f();
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

gpt::model_config bench_model(const std::string& pattern, int capacity) {
    gpt::model_config c;
    c.vocab = 4096;
    c.hidden = 512;
    c.heads = 8;
    c.ffn_hidden = 2048;
    c.seq_len = 128;
    c.batch = capacity;
    c.layer_pattern = pattern;
    c.experts = 4;
    c.top_k = 2;
    c.capacity_factor = 2.0; // no token dropped
    c.init_stddev = 0.02f;
    return c;
}

void fill_request(gpt::inference_model<T>& m, int rows, cudaStream_t s, int slot) {
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<int> tok(0, m.config().vocab - 1);
    std::vector<int> t(std::size_t(rows) * m.config().seq_len);
    for (int& x : t) x = tok(rng);
    m.set_request(t, rows, rows, s, slot);
}

cuda::graph capture_stages(const std::vector<stage>& stages, std::size_t first, std::size_t count, cudaStream_t s) {
    return cuda::capture(s, [&](cudaStream_t cs) {
        for (std::size_t i = first; i < first + count; ++i) stages[i].forward(cs);
    });
}

struct update_row {
    std::string what;
    int graphs = 0;
    std::size_t nodes = 0;
    double capture_us = 0, instantiate_us = 0, update_us = 0;
    long refusals = 0;
};

//! The CUDA API split: per graph, capture, instantiate and update timed alone (medians of the
//! rounds, summed over the graphs). Updates apply the other input slot's capture.
update_row api_split(gpt::inference_model<T>& m, int rows, bool per_layer, int rounds, cudaStream_t s) {
    const auto a = m.forward_stages(rows, 0), b = m.forward_stages(rows, 1);
    // Segments: the whole list, or each layer's stages (embedding and head excluded, as in scope layer).
    std::vector<std::pair<std::size_t, std::size_t>> segs;
    if (!per_layer) segs.push_back({0, a.size()});
    else
        for (std::size_t i = 0; i < a.size();) {
            std::size_t j = i + 1;
            while (j < a.size() && a[j].layer == a[i].layer) ++j;
            if (a[i].layer >= 0) segs.push_back({i, j - i});
            i = j;
        }
    update_row row;
    row.what = per_layer ? "scope layer (one graph per layer)" : "scope block (the whole forward)";
    row.graphs = int(segs.size());
    for (const auto& [first, count] : segs) {
        std::vector<double> cap, inst, upd;
        for (int r = 0; r < rounds; ++r) {
            cuda::graph g0, g1;
            cap.push_back(host_us([&] { g0 = capture_stages(a, first, count, s); }));
            g1 = capture_stages(b, first, count, s);
            cuda::graph_exec e;
            inst.push_back(host_us([&] { e = cuda::graph_exec(g0); }));
            cuda::update_result res = cuda::update_result::updated;
            upd.push_back(host_us([&] { res = e.update(g1); }));
            row.refusals += res == cuda::update_result::refused;
            if (r == 0) row.nodes += g0.node_count();
            e.launch(s); // the updated graph runs
        }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        row.capture_us += median(cap);
        row.instantiate_us += median(inst);
        row.update_us += median(upd);
    }
    return row;
}

//! Through the runner (scope block, one bucket): reset() + capture_all() instantiates the graph
//! again; rebind() to the other input slot + capture_all() captures it again and updates it.
std::pair<double, double> runner_paths(gpt::inference_model<T>& m, int rows, int rounds, cudaStream_t s, long& updates) {
    using cfg = config<impl::lazy_per_layer, inference::per_block, warmup_steps<0>, buckets<8>>;
    const int sizes[] = {rows};
    inference_runner<cfg> r(m.inference_program(sizes, 0));
    r.capture_all(s);
    std::vector<double> inst, upd;
    int slot = 0;
    for (int k = 0; k < rounds; ++k) {
        inst.push_back(host_us([&] {
            r.reset();
            r.capture_all(s);
        }));
        slot ^= 1;
        auto program = m.inference_program(sizes, slot); // built outside the timed region
        upd.push_back(host_us([&] {
            r.rebind(std::move(program));
            r.capture_all(s);
        }));
    }
    r.run(r.choose(rows), s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    updates = r.counters().exec_updates;
    return {median(inst), median(upd)};
}

struct step_row {
    int batch = 0;
    double eager_us = 0, layer_us = 0, block_us = 0;
};

template <class Runner> double time_runner(Runner& r, int rows, int reps, cudaStream_t s) {
    const bucket_choice c = r.choose(rows);
    for (int i = 0; i < 5; ++i) r.run(c, s); // warmup runs and capture
    cuda::event t0 = cuda::event::timing(), t1 = cuda::event::timing();
    t0.record(s);
    for (int i = 0; i < reps; ++i) r.run(c, s);
    t1.record(s);
    t1.synchronize();
    float ms = 0;
    CAPSCOPE_CHECK(cudaEventElapsedTime(&ms, t0.get(), t1.get()));
    return 1000.0 * ms / reps;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 15;
    std::string markdown, csv_path;
    bench::arguments("inference").integer("--rounds", rounds, 1).text("--markdown", markdown).text("--csv", csv_path).parse_or_exit(argc, argv);
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: benchmark skipped");
        return cuda::skip_exit_code;
    }
    cudaDeviceProp prop{};
    CAPSCOPE_CHECK(cudaGetDeviceProperties(&prop, 0));
    cuda::stream s;
    bench::figures_csv csv(csv_path);
    std::string md = "### Inference graphs: exec update against instantiation, and step time by scope\n\nDevice: " + std::string(prop.name) +
                     ", bf16, hidden 512, seq 128. Host times (steady_clock) are medians of " + std::to_string(rounds) +
                     " rounds; all variants run in one process.\n\n";

    // 1. Update vs instantiate, 24 dense layers, batch 8.
    {
        gpt::inference_model<T> m(bench_model(std::string(24, 'D'), 8), s.get());
        fill_request(m, 8, s.get(), 0);
        fill_request(m, 8, s.get(), 1);
        m.forward(8, s.get());
        md += "#### Capture + instantiate vs capture + exec update (24 layers, batch 8)\n\n"
              "| graphs | nodes | capture (us) | instantiate (us) | exec update (us) | instantiate / update | "
              "(capture + instantiate) / (capture + update) | refused updates |\n|---|---|---|---|---|---|---|---|\n";
        for (bool per_layer : {false, true}) {
            const update_row r = api_split(m, 8, per_layer, rounds, s.get());
            char line[512];
            std::snprintf(line, sizeof line, "| %s: %d | %zu | %.1f | %.1f | %.1f | %.1fx | %.2fx | %ld |\n", r.what.c_str(), r.graphs, r.nodes,
                          r.capture_us, r.instantiate_us, r.update_us, r.instantiate_us / r.update_us,
                          (r.capture_us + r.instantiate_us) / (r.capture_us + r.update_us), r.refusals);
            md += line;
            std::printf("%s", line);
            const std::string what = r.what + ": " + std::to_string(r.graphs) + (r.graphs == 1 ? " graph" : " graphs");
            csv.row("exec update", what, "", "nodes", double(r.nodes));
            csv.row("exec update", what, "", "capture_us", r.capture_us);
            csv.row("exec update", what, "", "instantiate_us", r.instantiate_us);
            csv.row("exec update", what, "", "update_us", r.update_us);
            csv.row("exec update", what, "", "refused_updates", double(r.refusals));
        }
        long updates = 0;
        const auto [inst, upd] = runner_paths(m, 8, rounds, s.get(), updates);
        char line[512];
        std::snprintf(line, sizeof line,
                      "\nThrough the runner (scope block): `reset()` + `capture_all()` %.1f us; `rebind()` to the other input slot + "
                      "`capture_all()` %.1f us (%.2fx; %ld exec updates, no re-instantiation).\n\n",
                      inst, upd, inst / upd, updates);
        md += line;
        std::printf("%s", line);
        csv.row("exec update", "through the runner, scope block", "reset() + capture_all()", "host_us", inst);
        csv.row("exec update", "through the runner, scope block", "rebind() + capture_all()", "host_us", upd);
    }

    // 2. Step time by scope.
    {
        gpt::inference_model<T> m(bench_model("DEMD", 64), s.get());
        fill_request(m, 64, s.get(), 0);
        using sizes = buckets<1, 8, 64>;
        using none_cfg = config<impl::eager, sizes>;
        using layer_cfg = config<impl::lazy_per_layer, inference::per_layer, model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<2.0>, pad_to_capacity>,
                                 warmup_steps<1>, sizes>;
        using block_cfg = config<impl::lazy_per_layer, inference::per_block, model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<2.0>, pad_to_capacity>,
                                 warmup_steps<1>, sizes>;
        const auto list = none_cfg::engine.batch_buckets.view();
        inference_runner<none_cfg> eager(m.inference_program(list));
        inference_runner<layer_cfg> layer(m.inference_program(list));
        inference_runner<block_cfg> block(m.inference_program(list));
        md += "#### One forward, eager vs scope layer vs scope block (layers D E M D)\n\n"
              "Device time per forward (CUDA events over 200 forwards, median of the rounds; small batches are launch-bound).\n\n"
              "| batch | eager (us) | scope layer (us) | scope block (us) | eager / layer | eager / block |\n|---|---|---|---|---|---|\n";
        for (int batch : {1, 8, 64}) {
            std::vector<double> e, l, b;
            for (int r = 0; r < std::max(3, rounds / 3); ++r) { // round-robin, so drift hits all three alike
                e.push_back(time_runner(eager, batch, 200, s.get()));
                l.push_back(time_runner(layer, batch, 200, s.get()));
                b.push_back(time_runner(block, batch, 200, s.get()));
            }
            char line[256];
            std::snprintf(line, sizeof line, "| %d | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", batch, median(e), median(l), median(b),
                          median(e) / median(l), median(e) / median(b));
            md += line;
            std::printf("%s", line);
            const std::string what = "batch " + std::to_string(batch);
            csv.row("inference by scope", what, "eager", "device_us", median(e));
            csv.row("inference by scope", what, "scope layer", "device_us", median(l));
            csv.row("inference by scope", what, "scope block", "device_us", median(b));
        }
        md += "\n";
    }
    if (!markdown.empty()) std::ofstream(markdown) << md;
    return 0;
}
