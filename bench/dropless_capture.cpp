// Dropless MoE captured (capscope's static_expert_capacity) against what dropless needs without
// it: attention and the router captured per layer, the preprocess and the experts eager because
// the preprocess reads the per-expert counts back (rule S6, partial capture). The captured runs
// give each expert a static capacity of factor x the mean and capture the whole step; a step in
// which an expert gets more is rerun eagerly. A last variant, drop-and-pad at the first factor,
// is the step such a capacity runs when it holds (the same shapes, no rerun). Every variant trains
// on the same batches (a pool, one per step in turn), timed round-robin in one process; the reruns
// are counted over the timed steps, and each MoE layer's largest expert load is printed, which a
// capacity must cover to run without reruns.
//
//   dropless_capture [--layers L] [--rounds R] [--factors F1,F2]

#include "arguments.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

int layer_count = 12;
constexpr int pool = 8; // batches, one per step in turn

//! static_factor > 0: dropless with that static capacity; < 0: drop-and-pad at capacity -static_factor.
gpt::model_config bench_model(double static_factor) {
    gpt::model_config c;
    c.vocab = 256;
    c.hidden = 1024;
    c.heads = 16;
    c.ffn_hidden = 2048;
    c.seq_len = 2048;
    c.batch = 1;
    c.experts = 8;
    c.top_k = 2;
    c.moe_mode = gpt::moe_mode::dropless;
    c.dropless_capacity_factor = std::max(static_factor, 0.0);
    if (static_factor < 0) {
        c.moe_mode = gpt::moe_mode::drop_and_pad;
        c.capacity_factor = -static_factor;
    }
    c.layer_pattern.clear();
    for (int l = 0; l < layer_count; ++l) c.layer_pattern += l % 2 ? 'D' : 'E'; // moe_every<2>
    return c;
}

struct variant {
    std::string name;
    std::unique_ptr<gpt::gpt_model<T>> model;
    cuda::device_buffer<int> batches; //!< tokens then labels of each batch of the pool
    std::function<long()> reruns;
    std::function<void(cudaStream_t)> run;
    std::vector<float> device_ms, host_us;
    int next = 0;
    void step(cudaStream_t s) {
        // The next batch of the pool into the model's inputs (two device copies, in every variant).
        const std::size_t t = std::size_t(model->config().tokens());
        const int* b = batches.data() + std::size_t(next) * 2 * t;
        CAPSCOPE_CHECK(cudaMemcpyAsync(model->tokens(0), b, t * sizeof(int), cudaMemcpyDeviceToDevice, s));
        CAPSCOPE_CHECK(cudaMemcpyAsync(model->labels(0), b + t, t * sizeof(int), cudaMemcpyDeviceToDevice, s));
        next = (next + 1) % pool;
        run(s);
    }
};

template <class Config> variant build(std::string name, double static_factor, cudaStream_t s, gpt::adamw_config opt = {}) {
    variant v;
    v.name = std::move(name);
    v.model = std::make_unique<gpt::gpt_model<T>>(bench_model(static_factor), s);
    const std::size_t t = std::size_t(v.model->config().tokens());
    std::vector<int> host(std::size_t(pool) * 2 * t);
    std::mt19937 rng(11);
    for (int& x : host) x = int(rng() % 256);
    v.batches = cuda::device_buffer<int>(host.size());
    CAPSCOPE_CHECK(cudaMemcpyAsync(v.batches.data(), host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, s));
    v.model->set_optimizer(opt, s);
    auto r = std::make_shared<runner<Config>>(v.model->training_program());
    v.run = [r](cudaStream_t st) { r->step(st); };
    v.reruns = [r] { return r->counters().reruns; };
    for (int i = 0; i < 3; ++i) v.step(s); // warmup and capture
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return v;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 10;
    std::vector<double> factors = {1.5, 4.0};
    bench::arguments("dropless_capture")
        .integer("--layers", layer_count, 2)
        .integer("--rounds", rounds, 1)
        .positive_reals("--factors", factors, 2)
        .parse_or_exit(argc, argv);
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    std::printf("%s; bf16 h1024 s2048 b1, %d layers (MoE and dense in turn, 8 experts top-2, dropless), %d batches in turn; "
                "%d rounds of 5 steps each, round-robin\n",
                gpu.c_str(), layer_count, pool, rounds);
    using te = impl::ahead_of_time_per_layer;
    using facts = model<experts<8>, moe_every<2>>;
    std::vector<variant> all;
    all.push_back(build<config<te, modules<capture::attention, capture::mlp, capture::moe_router>, facts, warmup_steps<1>>>(
        "partial capture: attn, mlp, moe_router per layer (transformer_engine)", 0, s));
    for (double f : factors) {
        char name[96];
        std::snprintf(name, sizeof name, "whole step, static capacity %.2f x the mean", f);
        all.push_back(build<config<impl::whole_iteration, facts, no_nan_check, static_expert_capacity, warmup_steps<1>>>(name, f, s));
    }
    // How unevenly this model routes: each MoE layer's largest expert load over the pool, as a
    // factor of the mean, from the plain dropless variant's counts (every assignment). A static
    // capacity below the largest reruns.
    auto loads = [&](variant& plain) {
        const gpt::model_config& c = plain.model->config();
        const double mean = double(c.tokens()) * c.top_k / c.experts;
        std::vector<double> largest(std::size_t(layer_count + 1) / 2, 0.0);
        for (int i = 0; i < pool; ++i) {
            plain.step(s);
            for (int l = 0; l < layer_count; l += 2) {
                std::vector<int> counts(std::size_t(c.experts));
                CAPSCOPE_CHECK(cudaMemcpyAsync(counts.data(), plain.model->expert_counts(l), counts.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
                CAPSCOPE_CHECK(cudaStreamSynchronize(s));
                for (int n : counts) largest[std::size_t(l / 2)] = std::max(largest[std::size_t(l / 2)], n / mean);
            }
        }
        std::string out;
        for (std::size_t i = 0; i < largest.size(); ++i) out += " layer " + std::to_string(2 * i) + ": " + std::to_string(largest[i]).substr(0, 4) + "x;";
        return out;
    };
    {
        // lr 0: the loads of the weights as built.
        variant fresh = build<config<te, modules<capture::attention, capture::mlp, capture::moe_router>, facts, warmup_steps<1>>>("", 0, s, {0.f});
        std::printf("largest expert load over the %d batches, as a factor of the mean, as built:%s\n", pool, loads(fresh).c_str());
    }
    // The step a static capacity runs when it holds, with no rerun: drop-and-pad at the first
    // factor has the same shapes (what a balanced routing would get; it drops what overflows).
    {
        char name[96];
        std::snprintf(name, sizeof name, "whole step, drop-and-pad %.2f (same shapes, no rerun)", factors[0]);
        all.push_back(build<config<impl::whole_iteration, facts, no_nan_check, warmup_steps<1>>>(name, -factors[0], s));
    }
    std::vector<long> before;
    for (const variant& v : all) before.push_back(v.reruns());
    bench::time_round_robin(all, rounds, 5, s);
    // The mean is what a run takes (a rerun step is a slow one); the median, a step without one.
    auto mean = [](const std::vector<float>& x) {
        double sum = 0;
        for (float v : x) sum += v;
        return x.empty() ? 0.0 : sum / double(x.size());
    };
    std::printf("largest expert load over the %d batches, as a factor of the mean, after the timed steps:%s\n", pool, loads(all[0]).c_str());
    const double base = mean(all[0].device_ms);
    for (std::size_t i = 0; i < all.size(); ++i) {
        const variant& v = all[i];
        const long reruns = v.reruns() - before[i];
        std::printf("%-66s mean %8.3f ms/step (%.3fx)  median %8.3f ms  host %8.1f us  reruns %ld of %d steps\n", v.name.c_str(),
                    mean(v.device_ms), mean(v.device_ms) / base, bench::median(v.device_ms), bench::median(v.host_us), reruns, rounds * 5);
    }
    return 0;
}
