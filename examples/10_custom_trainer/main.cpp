// Tutorial 10: capscope on a trainer of your own. Nothing here comes from the example GPT model:
// a residual-MLP stack (residual_mlp.hpp) with its own cuBLAS calls and kernels, and stage kinds
// and capture regions of its own, "up" and "down", declared as a layer schema.
//
// It trains the same model four ways and checks each against its own hand-written eager loop,
// bit for bit: capture "down" only (one part of each block captured, the other eager), both
// parts, and the whole step; then shows the error for a selection that matches no stage.
//
//   10_custom_trainer [--steps N]
//
// Exits 1 unless every run is bitwise equal to the hand-written loop and the loss falls; 77
// without a GPU.

#include "residual_mlp.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace capscope;

// [snippet configs]
// Capture the "down" part of each block, lazily; "up" stays eager.
using down_only = config<impl::lazy_per_layer, capture_regions<"down">, warmup_steps<2>>;
// Both parts: each block is one forward and one backward graph, captured ahead of time.
using both_parts = config<impl::ahead_of_time_per_layer, capture_regions<"up", "down">, warmup_steps<2>>;
// The whole step, SGD included, as one graph.
using whole_step = config<impl::whole_iteration, no_nan_check, warmup_steps<2>>;
// [snippet configs]

namespace {

struct trace {
    std::vector<float> losses, weights;
    double ms_per_step = 0;
};

template <class Step>
trace train(custom::residual_mlp& m, int steps, cudaStream_t s, Step&& step) {
    trace t;
    auto start = cuda::event::timing(), stop = cuda::event::timing();
    const int timed_from = steps / 2; // after warmup and capture
    for (int i = 0; i < steps; ++i) {
        if (i == timed_from) start.record(s);
        step(s);
        t.losses.push_back(m.loss(s)); // (synchronizes: the timing covers the step and this copy alike)
    }
    stop.record(s);
    stop.synchronize();
    t.ms_per_step = cuda::event::elapsed_ms(start, stop) / float(steps - timed_from);
    t.weights = m.weights(s);
    return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class Config>
bool run(const char* title, const custom::shape& sh, int steps, const trace& by_hand, cudaStream_t s) {
    // [snippet runner]
    custom::residual_mlp m(sh, s);
    runner<Config, layer_schemas<custom::residual_block>> r(m.training_program());
    // [snippet runner]
    std::printf("\n== %s\n%s", title, r.plan_text().c_str());
    const trace t = train(m, steps, s, [&](cudaStream_t st) { r.step(st); });
    const runner_counters& k = r.counters();
    const bool same = same_bits(t.losses, by_hand.losses) && same_bits(t.weights, by_hand.weights);
    std::printf("counters: %ld steps, %ld captures, %ld replays, %ld eager segment runs\n", k.steps, k.captures, k.replays,
                k.eager_segment_runs);
    std::printf("loss %.5f -> %.5f; %.3f ms/step (hand-written eager loop: %.3f ms, %.2fx); bitwise equal to the hand-written loop: %s\n",
                t.losses.front(), t.losses.back(), t.ms_per_step, by_hand.ms_per_step, by_hand.ms_per_step / t.ms_per_step,
                same ? "yes" : "NO");
    return same;
}

} // namespace

int main(int argc, char** argv) {
    int steps = 40;
    for (int i = 1; i < argc; ++i) {
        char* end = nullptr;
        const long n = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0; // strtol, not atoi: "9x" is no number
        if (std::strcmp(argv[i], "--steps") == 0 && end && *end == '\0' && n >= 8 && n <= 100000) steps = int(n), ++i;
        else {
            std::fprintf(stderr, "usage: 10_custom_trainer [--steps N]   (8 <= N <= 100000)\n");
            return 2;
        }
    }
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        const custom::shape sh;
        std::printf("residual MLP: %d blocks of %d -> %d -> %d features, %d rows, SGD lr %.2f, %d steps\n", sh.blocks, sh.features, sh.hidden,
                    sh.features, sh.rows, double(sh.lr), steps);
        custom::residual_mlp reference(sh, s);
        const trace by_hand = train(reference, steps, s, [&](cudaStream_t st) { reference.step_by_hand(st); });
        bool ok = by_hand.losses.back() < 0.9f * by_hand.losses.front();
        ok = run<down_only>("capture_regions<\"down\">, impl local: one part of each block captured, the other eager", sh, steps, by_hand, s) && ok;
        ok = run<both_parts>("capture_regions<\"up\", \"down\">, impl transformer_engine: whole blocks", sh, steps, by_hand, s) && ok;
        ok = run<whole_step>("impl full_iteration: the whole step, SGD included", sh, steps, by_hand, s) && ok;

        // A selection that matches no stage of this model is an error, not a run that is eager for ever.
        std::puts("\n== modules<capture::attention> on this model (a Megatron module it does not have):");
        try {
            custom::residual_mlp m(sh, s);
            runner<config<impl::lazy_per_layer, modules<capture::attention>>> r(m.training_program());
            std::puts("no error: FAIL");
            ok = false;
        } catch (const plan_error& e) {
            std::printf("%s\n", e.what());
        }
        std::printf("\n%s\n", ok ? "every run bitwise equal to the hand-written loop, and the loss fell" : "FAIL");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "10_custom_trainer: %s\n", e.what());
        return 1;
    }
}
