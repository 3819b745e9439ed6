// The example model's side of the comparison with its PyTorch peer (bench/peers/gpt_peer.py).
//
//   same_model --hidden H --seq S --batch B --layers L [--mixed] [--vocab V] [--check-steps N] [--rounds R]
//              [--profile] --out DIR
//
// bf16, heads of 64, ffn 4 x hidden, one microbatch, AdamW (lr 1e-4). Dense layers, or with
// --mixed the layer pattern EDMD repeated (an MoE layer with 8 experts, top-2, drop-and-pad at
// capacity factor 1.0, then dense, Mamba-style, dense; L a multiple of 4). Writes to DIR:
// - weights.safetensors: the initial fp32 master weights, and the config as metadata;
// - batches.bin: N batches (int32 tokens, then int32 labels, each batch x seq), a learnable
//   task (each next token is 3 x + 7 mod vocab of the one before, from a random start);
// - losses.txt: the loss of each of the N training steps from those weights on those batches
//   (N = 10 by default: the task's early loss spikes amplify rounding differences, so past about
//   ten steps two correct bf16 implementations drift apart by more than rounding);
// - gradients_step1.safetensors: every parameter's gradient after the first step;
// - routing_step1.bin (mixed only): each MoE layer's routing map in the first step (int32,
//   tokens x top-k experts, layer after layer), so the peer can check its gradients on the same
//   routing: one token routed differently (a near tie, a capacity drop) changes whole rows;
// - capscope.csv: median device ms per training step (zero_grad, forward, backward, AdamW) for
//   eager, per-layer graphs (transformer_engine, whole layers) and the whole step as one graph
//   (full_iteration), timed round-robin (R rounds x 10 steps each, after warmup).
// The peer loads the weights and batches, checks its losses against losses.txt, and times
// PyTorch's variants of the same step. With --profile, no timing: after the warmup one whole-step
// graph runs between cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`
// (bench/profile.sh). Exits 77 without a GPU.

#include "arguments.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>
#include <gpt/save_parameters.hpp>
#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cuda_profiler_api.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

struct options {
    int hidden = 512, seq = 128, batch = 1, layers = 24, vocab = 256, check_steps = 10, rounds = 10;
    bool mixed = false, profile = false;
    std::string out;
};

//! The command line, or exit 2 naming what was wrong.
options parse(int argc, char** argv) {
    options o;
    const bench::arguments args = bench::arguments("same_model")
                                      .integer("--hidden", o.hidden, 64)
                                      .integer("--seq", o.seq, 1)
                                      .integer("--batch", o.batch, 1)
                                      .integer("--layers", o.layers, 1)
                                      .flag("--mixed", o.mixed)
                                      .integer("--vocab", o.vocab, 2)
                                      .integer("--check-steps", o.check_steps, 1)
                                      .integer("--rounds", o.rounds, 1)
                                      .flag("--profile", o.profile)
                                      .text("--out", o.out, "DIR")
                                      .required();
    args.parse_or_exit(argc, argv);
    if (o.hidden % 64) args.refuse("--hidden must be a multiple of 64 (heads of 64)");
    if (o.mixed && o.layers % 4) args.refuse("--mixed repeats EDMD: --layers must be a multiple of 4");
    return o;
}

gpt::model_config model_of(const options& o) {
    gpt::model_config c;
    c.vocab = o.vocab;
    c.hidden = o.hidden;
    c.heads = o.hidden / 64;
    c.ffn_hidden = 4 * o.hidden;
    c.seq_len = o.seq;
    c.batch = o.batch;
    c.layer_pattern = std::string(std::size_t(o.layers), 'D');
    if (o.mixed) {
        c.layer_pattern.clear();
        for (int i = 0; i < o.layers / 4; ++i) c.layer_pattern += "EDMD";
        c.experts = 8;
        c.top_k = 2;
        c.capacity_factor = 1.0;
        c.moe_mode = gpt::moe_mode::drop_and_pad;
    }
    return c;
}

//! A batch of the task: x[0] random, x[i+1] = (3 x[i] + 7) mod vocab; labels the next token.
void make_batch(const gpt::model_config& c, std::mt19937& rng, std::vector<int>& tokens, std::vector<int>& labels) {
    std::uniform_int_distribution<int> start(0, c.vocab - 1);
    tokens.assign(std::size_t(c.tokens()), 0);
    labels.assign(tokens.size(), -1);
    for (int b = 0; b < c.batch; ++b) {
        int x = start(rng);
        for (int i = 0; i < c.seq_len; ++i) {
            const std::size_t at = std::size_t(b) * std::size_t(c.seq_len) + std::size_t(i);
            tokens[at] = x;
            x = (3 * x + 7) % c.vocab;
            if (i + 1 < c.seq_len) labels[at] = x;
        }
    }
}

struct variant {
    std::string name;
    std::function<void(cudaStream_t)> run;
    std::vector<float> device_ms, host_us;
    void step(cudaStream_t s) { run(s); }
};

//! Each MoE router's routing map (its stage's output "<layer>.routing_map"), in stage order, to
//! `path`. Throws if the program has none (a file without maps would fail the peer's check later).
void save_routing(const training_program& program, const std::string& path, cudaStream_t s) {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> host;
    int maps = 0;
    for (const stage& st : program.microbatches.at(0))
        for (const tensor_ref& r : st.outputs) {
            if (st.kind != stage_kind::moe_router || !r.name.ends_with(".routing_map")) continue;
            ++maps;
            host.resize(r.bytes);
            CAPSCOPE_CHECK(cudaMemcpyAsync(host.data(), r.data, r.bytes, cudaMemcpyDeviceToHost, s));
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            f.write(host.data(), std::streamsize(host.size()));
        }
    if (maps == 0) throw std::logic_error("save_routing: no moe_router stage has an output named '<layer>.routing_map'");
    if (!f) throw std::runtime_error("could not write '" + path + "'");
}

// What the timed configs state about the model (rule P10 checks it against the program): nothing
// for the dense model; for the mixed one, its MoE layers (every 4th from the first) and their
// drop-and-pad capacity, which the whole-layer and whole-step captures need.
using mixed_facts = capscope::model<experts<8>, moe_every<4>, capacity_factor<1.0>, pad_to_capacity>;

//! The three ways to run the same step, timed round-robin; writes DIR/capscope.csv. With
//! --profile, one whole-step graph for the profiler instead.
template <class Facts>
void time_three_ways(gpt::gpt_model<T>& model, runner<config<impl::eager>>& eager, const options& o, cudaStream_t s) {
    using te = config<impl::ahead_of_time_per_layer, modules<>, Facts, warmup_steps<2>>;
    using whole = config<impl::whole_iteration, Facts, no_nan_check, warmup_steps<2>>;
    runner<te, gpt::schemas::drop_and_pad_model> per_layer(model.training_program());
    runner<whole, gpt::schemas::drop_and_pad_model> whole_step(model.training_program());
    std::vector<variant> variants;
    variants.push_back({"eager", [&](cudaStream_t st) { eager.step(st); }, {}, {}});
    variants.push_back({"per-layer graphs", [&](cudaStream_t st) { per_layer.step(st); }, {}, {}});
    variants.push_back({"whole-step graph", [&](cudaStream_t st) { whole_step.step(st); }, {}, {}});
    if (o.profile) { // only the whole step is profiled: the others need no warmup
        for (int i = 0; i < 5; ++i) whole_step.step(s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        CAPSCOPE_CHECK(cudaProfilerStart());
        whole_step.step(s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        CAPSCOPE_CHECK(cudaProfilerStop());
        std::puts("capscope whole-step graph: one step between cudaProfilerStart and cudaProfilerStop");
        return;
    }
    for (auto& v : variants)
        for (int i = 0; i < 5; ++i) v.step(s); // warmup and capture
    bench::time_round_robin(variants, o.rounds, 10, s);
    std::ofstream csv(o.out + "/capscope.csv");
    csv << "variant,ms\n";
    for (const auto& v : variants) {
        csv << v.name << ',' << bench::median(v.device_ms) << '\n';
        std::printf("capscope %-18s %9.3f ms/step\n", v.name.c_str(), bench::median(v.device_ms));
    }
    if (!csv) throw std::runtime_error("could not write '" + o.out + "/capscope.csv'");
}

} // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        std::filesystem::create_directories(o.out);
        cuda::stream s;
        const gpt::model_config cfg = model_of(o);
        gpt::gpt_model<T> model(cfg, s);
        model.set_optimizer({1e-4f}, s);
        gpt::save_parameters(model, o.out + "/weights.safetensors", s);

        // The check: N eager steps on fixed batches (eager and graphed steps are the same bits).
        const training_program program = model.training_program();
        runner<config<impl::eager>> eager(program);
        std::mt19937 rng(2026);
        std::ofstream batches(o.out + "/batches.bin", std::ios::binary), losses(o.out + "/losses.txt");
        std::vector<int> tokens, labels;
        for (int step = 0; step < o.check_steps; ++step) {
            make_batch(cfg, rng, tokens, labels);
            batches.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * sizeof(int)));
            batches.write(reinterpret_cast<const char*>(labels.data()), std::streamsize(labels.size() * sizeof(int)));
            model.set_batch(tokens, labels, s);
            eager.step(s);
            losses << model.loss(s) << '\n';
            if (step == 0) {
                gpt::save_parameters(model, o.out + "/gradients_step1.safetensors", s, gpt::saved_arena::gradients);
                if (o.mixed) save_routing(program, o.out + "/routing_step1.bin", s);
            }
        }
        if (!batches || !losses) throw std::runtime_error("could not write to '" + o.out + "'");

        if (o.mixed) time_three_ways<mixed_facts>(model, eager, o, s);
        else time_three_ways<capscope::model<>>(model, eager, o, s);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "same_model: %s\n", e.what());
        return 1;
    }
}
