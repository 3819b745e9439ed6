// Activation offload on the example model: peak device memory against step time.
//
//   offload [--layers L] [--rounds R] [--csv FILE]        then   python3 bench/offload_plot.py FILE > docs/bench/offload.svg
//
// bf16, hidden 1024, 16 heads, ffn 4096, seq 2048, batch 2, 24 dense layers, vocab 256, one
// microbatch, transformer_engine over whole layers with delay_offload_until_cuda_graph (each
// layer's copies out are a graph of their own after the layer's). Variants: no offload, and
// offload sets and fractions. Each variant is built beside the no-offload baseline and the two
// are timed round-robin (device time between CUDA events, median), so the ratio is side by
// side. Per variant: device memory in use once built, warmed up and captured (the model
// allocates everything up front, so this is the peak), the part that is activations (less the
// parameter and optimizer-state bytes), what the copies move per step, and the bandwidth that
// needs against the D2H bandwidth measured here. Exits 77 without a GPU.

#include "arguments.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>
#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <algorithm>
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
using om = offload_module;
using bench::device_used;
using bench::median;

int layer_count = 24;

gpt::model_config bench_model() {
    gpt::model_config c;
    c.vocab = 256;
    c.hidden = 1024;
    c.heads = 16;
    c.ffn_hidden = 4096;
    c.seq_len = 2048;
    c.batch = 2;
    c.layer_pattern = std::string(std::size_t(layer_count), 'D');
    return c;
}

struct trainer {
    std::unique_ptr<gpt::gpt_model<T>> model;
    std::function<void(cudaStream_t)> step;
    std::shared_ptr<void> runner;
    double used = 0, state = 0, moved = 0;
};

template <class Config> trainer build(bool offloading, cudaStream_t s, offload_ring ring = {}) {
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const std::size_t before = device_used();
    trainer t;
    gpt::activation_offload offload;
    if (offloading) offload = {Config::normalized.offload, ring};
    t.model = std::make_unique<gpt::gpt_model<T>>(bench_model(), s, std::nullopt, offload);
    const auto& c = t.model->config();
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(0, c.vocab - 1);
    std::vector<int> tokens(std::size_t(c.tokens())), labels(tokens.size());
    for (auto& x : tokens) x = tok(rng);
    for (std::size_t i = 0; i < tokens.size(); ++i) labels[i] = (i + 1) % std::size_t(c.seq_len) ? tokens[i + 1] : -1;
    t.model->set_batch(0, tokens, labels, s);
    auto r = std::make_shared<runner<Config, gpt::schemas::drop_and_pad_model>>(t.model->training_program(capture_scope_of<Config>));
    t.step = [p = r.get()](cudaStream_t st) { p->step(st); };
    t.runner = r;
    for (int i = 0; i < 3; ++i) t.step(s); // warmup, capture, a replay
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    t.used = double(device_used() - before);
    t.state = double(t.model->parameters().device_bytes());
    t.moved = 2.0 * double(t.model->activations().plan().copied_bytes()); // out and back
    return t;
}

//! Device-to-host bandwidth of one 256 MiB copy into pinned memory (GB/s), median of 5.
double d2h_bandwidth(cudaStream_t s) {
    const std::size_t bytes = 256u << 20;
    cuda::device_buffer<std::byte> d(bytes);
    cuda::pinned_buffer<std::byte> h(bytes);
    std::vector<float> ms;
    auto a = cuda::event::timing(), b = cuda::event::timing();
    for (int i = 0; i < 5; ++i) {
        a.record(s);
        CAPSCOPE_CHECK(cudaMemcpyAsync(h.data(), d.data(), bytes, cudaMemcpyDeviceToHost, s));
        b.record(s);
        b.synchronize();
        ms.push_back(cuda::event::elapsed_ms(a, b));
    }
    return double(bytes) / (median(ms) * 1e6);
}

//! The baseline's forward alone, run eagerly through the model's own forward (median of 10, ms):
//! at this size its kernels, not its launches, take the time, so it stands for the graphed one.
double forward_ms(trainer& t, cudaStream_t s) {
    std::vector<float> ms;
    auto a = cuda::event::timing(), b = cuda::event::timing();
    t.model->forward(s); // untimed: the first eager forward after the graphs
    for (int i = 0; i < 10; ++i) {
        a.record(s);
        t.model->forward(s);
        b.record(s);
        b.synchronize();
        ms.push_back(cuda::event::elapsed_ms(a, b));
    }
    return median(ms);
}

struct row {
    std::string name;
    double base_ms, ms, base_used, used, state, moved;
};

template <class Config> row measure(const char* name, trainer& base, int rounds, cudaStream_t s, offload_ring ring = {}) {
    trainer v = build<Config>(true, s, ring);
    struct timed {
        trainer* t;
        std::vector<float> device_ms, host_us;
        void step(cudaStream_t st) { t->step(st); }
    };
    std::vector<timed> two{{&base, {}, {}}, {&v, {}, {}}};
    // One untimed round first: the baseline's first steps after another model's set-up (its
    // allocations, its captures) ran up to 20% slow, which a ratio against them would hide.
    bench::time_round_robin(two, 1, 5, s);
    for (timed& t : two) t.device_ms.clear(), t.host_us.clear();
    bench::time_round_robin(two, rounds, 5, s);
    row r{name, median(two[0].device_ms), median(two[1].device_ms), base.used, v.used, v.state, v.moved};
    std::printf("%-44s step %8.2f ms vs %8.2f ms without (%+.1f%%); device in use %7.0f MiB vs %7.0f MiB; activations %7.0f vs %7.0f MiB "
                "(-%.1f%%); copies %6.0f MiB/step (%.1f GB/s over the step)\n",
                name, r.ms, r.base_ms, 100.0 * (r.ms / r.base_ms - 1.0), r.used / 1048576.0, r.base_used / 1048576.0,
                (r.used - r.state) / 1048576.0, (r.base_used - r.state) / 1048576.0,
                100.0 * (1.0 - (r.used - r.state) / (r.base_used - r.state)), r.moved / 1048576.0, r.moved / (r.ms * 1e6));
    std::fflush(stdout);
    return r;
}

using te = impl::ahead_of_time_per_layer;
using small_set = offload_modules<om::qkv_linear, om::mlp_norm>; // attn_proj needs core_attn (O3)
using attention_set = offload_modules<om::qkv_linear, om::core_attn, om::attn_proj, om::mlp_norm>;
template <class... Parts>
using te_offload = config<te, modules<>, warmup_steps<1>, offload<Parts..., delay_offload_until_cuda_graph>>;

} // namespace

int main(int argc, char** argv) {
    int rounds = 6;
    std::string csv;
    bench::arguments("offload").integer("--layers", layer_count, 1).integer("--rounds", rounds, 1).text("--csv", csv).parse_or_exit(argc, argv);
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    std::printf("%s; bf16 h1024 s2048 b2, %d dense layers, transformer_engine whole layers, copies out delayed after each layer's graph\n",
                gpu.c_str(), layer_count);
    const double bandwidth = d2h_bandwidth(s);
    std::printf("device-to-host bandwidth (256 MiB, pinned): %.1f GB/s\n", bandwidth);
    trainer base = build<config<te, modules<>, warmup_steps<1>>>(false, s);
    std::vector<row> rows;
    rows.push_back(measure<te_offload<small_set>>("qkv_linear, mlp_norm", base, rounds, s));
    rows.push_back(measure<te_offload<attention_set, offload_fraction<0.5>>>("qkv_linear, core_attn, attn_proj, mlp_norm, fraction 0.5", base, rounds, s));
    rows.push_back(measure<te_offload<offload_modules<om::core_attn>, offload_fraction<0.25>>>("core_attn, fraction 0.25", base, rounds, s));
    // Under a fraction the last slots groups stay anyway, so more slots cost no memory; they let
    // the copies out lag further behind the forward, and the copies back start earlier.
    rows.push_back(measure<te_offload<offload_modules<om::core_attn>, offload_fraction<0.25>>>("core_attn, fraction 0.25, 7 slots", base, rounds, s,
                                                                                               offload_ring{7, 2}));
    rows.push_back(measure<te_offload<attention_set, offload_fraction<0.5>>>("qkv_linear, core_attn, attn_proj, mlp_norm, fraction 0.5, 7 slots",
                                                                            base, rounds, s, offload_ring{7, 2}));
    rows.push_back(measure<te_offload<offload_modules<om::core_attn>>>("core_attn", base, rounds, s));
    rows.push_back(measure<te_offload<attention_set>>("qkv_linear, core_attn, attn_proj, mlp_norm", base, rounds, s));
    // Copies out can overlap the rest of the forward and copies back the backward before them;
    // past what the link moves in that time, the step waits on the copies.
    // The baseline is timed beside every row: its spread says how far a ratio can be trusted.
    double step_ms = 0, low = rows.front().base_ms, high = low;
    std::vector<float> bases;
    for (const row& r : rows) {
        bases.push_back(float(r.base_ms));
        low = std::min(low, r.base_ms);
        high = std::max(high, r.base_ms);
    }
    step_ms = median(bases);
    std::printf("the step without offload, timed beside each row: median %.2f ms, from %.2f to %.2f ms (%.1f%% spread)\n", step_ms, low, high,
                100.0 * (high / low - 1.0));
    const double activations = base.used - base.state, goal = 0.3 * activations; // issue 33's goal: 30% less at <= 5% longer
    std::printf("the link moves %.0f MiB each way in one step without offload (%.2f ms at %.1f GB/s); activations without offload: %.0f MiB\n",
                step_ms * 1e6 * bandwidth / 1048576.0, step_ms, bandwidth, activations / 1048576.0);
    std::printf("30%% of the activations is %.0f MiB out and back per step: %.2f ms each way at %.1f GB/s, against a %.2f ms step (+5%%: %.2f ms)\n",
                goal / 1048576.0, goal / (bandwidth * 1e6), bandwidth, step_ms, 1.05 * step_ms);
    // The bound that matters: a tensor still on the device when the backward starts holds its
    // memory at the step's peak, wherever its copy goes later; so the memory saved is at most what
    // the link moves out during the forward (and the 5% the goal allows).
    const double fwd = forward_ms(base, s), out_by_backward = fwd * 1e6 * bandwidth, allowance = 0.05 * step_ms * 1e6 * bandwidth;
    std::printf("the forward alone (eager, the baseline model): %.2f ms of the %.2f ms step (%.0f%%); the link moves %.0f MiB out in it: "
                "%.1f%% of the activations, %.1f%% with the 5%% allowance (%.0f MiB more) -- no placement of the copies saves more "
                "at that cost, as what is not yet copied out when the backward starts is still on the device at the peak\n",
                fwd, step_ms, 100.0 * fwd / step_ms, out_by_backward / 1048576.0, 100.0 * out_by_backward / activations,
                100.0 * (out_by_backward + allowance) / activations, allowance / 1048576.0);
    if (!csv.empty()) {
        std::ofstream f(csv);
        f << "variant,step_ms,step_ms_without,device_mib,device_mib_without,state_mib,moved_mib_per_step\n";
        for (const row& r : rows)
            f << '"' << r.name << "\"," << r.ms << ',' << r.base_ms << ',' << r.used / 1048576.0 << ',' << r.base_used / 1048576.0 << ','
              << r.state / 1048576.0 << ',' << r.moved / 1048576.0 << '\n';
    }
    return 0;
}
