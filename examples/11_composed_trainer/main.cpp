// Tutorial 11: one composition. A trainer of its own (block_stack.hpp: its kernels, its regions
// "up" and "down", its activation names "pre_act" and "hidden") with everything a real trainer
// puts around its layers, named in one place and checked there:
// - a forward_pre hook on side lane 1 that gathers each block's working weights from the master
//   copy (a sharded trainer's all-gather, on one GPU); forked where it stands, after the block
//   before it, which it therefore does not overlap (a prefetch would fork it earlier);
// - a backward hook on side lane 4 that clamps each block's gradients, overlapping the backward
//   of the blocks before it;
// - a capture-time hook that counts the forward graphs as they are captured;
// - a step-level boundary hook after the optimizer that logs the loss (host work between steps;
//   under full_iteration there is no "between", rule H2, so that run leaves it out);
// - both named activations offloaded to pinned host memory, on copy lanes 2 and 3.
// No wait is written anywhere: every stage declares what it reads and writes, the plan derives
// each cross-stream wait, and the verifier proves the order before the first step.
//
// It trains under all four impls and checks each against the hand-written loop (one stream, no
// offload, gather and clamp inline), bit for bit.
//
//   11_composed_trainer [--steps N]
//
// Exits 1 unless every run is bitwise equal to the hand-written loop and the loss falls; 77
// without a GPU.

#include "block_stack.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>
#include <capscope/hooks.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace capscope;

// [snippet configs]
// The trainer's own tensors, offloaded by its own names: Megatron's offload rules (made for
// Megatron's modules) pass over them; plan rule P11 checks where their copies go.
using own_offload = offload<offload_tensors<"pre_act", "hidden">, min_offloaded_tensor_size<1>>;
using no_graphs = config<impl::eager, own_offload>;
using local_graphs = config<impl::lazy_per_layer, capture_regions<"up", "down">, own_offload, warmup_steps<2>>;
using ahead_of_time = config<impl::ahead_of_time_per_layer, capture_regions<"up", "down">, own_offload, warmup_steps<2>>;
using whole_step = config<impl::whole_iteration, no_nan_check, own_offload, warmup_steps<2>>;
// [snippet configs]

namespace {

struct trace {
    std::vector<float> losses, weights;
};

template <class Step>
trace train(composed::block_stack& m, int steps, cudaStream_t s, Step&& step) {
    trace t;
    for (int i = 0; i < steps; ++i) {
        step(s);
        t.losses.push_back(m.loss(s));
    }
    t.weights = m.weights(s);
    return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class Config>
bool run(const char* title, const composed::shape& sh, int steps, const trace& by_hand, cudaStream_t s) {
    // [snippet hooks]
    composed::block_stack m(sh, Config::normalized.offload, s);
    int captured_forwards = 0;
    std::vector<float> logged;
    auto gather = hook<hook_phase::forward_pre, capturable, on_lane<1>>(
        "gather", [&m](forward_pre_context& c) { m.gather(c.layer(), c.stream()); });
    auto clip = hook<hook_phase::backward, capturable, on_lane<4>>("clip", [&m](backward_context& c) { m.clip_gradients(c.layer(), c.stream()); });
    auto count = hook<hook_phase::forward, capture_time>("count captures", [&captured_forwards](forward_context&) { ++captured_forwards; });
    // [snippet step_hook]
    auto log = on_step<step_point::after_optimizer, boundary>("loss log", [&](step_context& c) { logged.push_back(m.loss(c.stream())); });
    // [snippet step_hook]
    // [snippet hooks]

    // [snippet composition]
    // One declaration: the program, its hooks (with what each block reads and writes) and its
    // offload. Hook rules H0, H1, H2, H4 and plan rules P1-P13 are checked here and when the runner plans; the order in
    // which the parts are named does not matter.
    // (The whole step is one graph: no boundary for the step hook's host work, rule H2.)
    const auto hooks = [&] {
        if constexpr (Config::impl == graph_impl::whole_iteration) return hook_pipeline{gather, clip, count};
        else return hook_pipeline{gather, clip, count, log};
    }();
    runner<Config, layer_schemas<composed::block>> r(composition<Config>(m.training_program()).hooks(hooks, m.layer_buffers()).offload(m.store()).program());
    // [snippet composition]

    std::printf("\n== %s\n%s", title, r.plan_text().c_str());
    const trace t = train(m, steps, s, [&](cudaStream_t st) { r.step(st); });
    const runner_counters& k = r.counters();
    const bool same = same_bits(t.losses, by_hand.losses) && same_bits(t.weights, by_hand.weights);
    const bool logged_ok = Config::impl == graph_impl::whole_iteration ? logged.empty() : same_bits(logged, t.losses);
    std::printf("counters: %ld steps, %ld captures, %ld replays, %ld eager segment runs; the capture-time hook ran %d times\n", k.steps,
                k.captures, k.replays, k.eager_segment_runs, captured_forwards);
    std::printf("offload: %d of %zu activation groups copied out and back, %.1f MiB of device memory saved\n", m.store().plan().copied_groups(),
                m.store().plan().groups.size(), double(m.store().plan().device_bytes_saved()) / (1 << 20));
    std::printf("loss %.5f -> %.5f (the step hook logged %zu losses%s); bitwise equal to the hand-written loop: %s\n", t.losses.front(),
                t.losses.back(), logged.size(), logged_ok ? "" : ", NOT the step's", same ? "yes" : "NO");
    return same && logged_ok;
}

} // namespace

int main(int argc, char** argv) {
    int steps = 12;
    for (int i = 1; i < argc; ++i) {
        char* end = nullptr;
        const long n = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0; // strtol, not atoi: "9x" is no number
        if (std::strcmp(argv[i], "--steps") == 0 && end && *end == '\0' && n >= 4 && n <= 100000) steps = int(n), ++i;
        else {
            std::fprintf(stderr, "usage: 11_composed_trainer [--steps N]   (4 <= N <= 100000)\n");
            return 2;
        }
    }
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        const composed::shape sh;
        std::printf("residual blocks: %d of %d -> %d -> %d features, %d rows, SGD lr %.2f, gradients clamped to +-%g, %d steps\n", sh.blocks,
                    sh.features, sh.hidden, sh.features, sh.rows, double(sh.lr), double(sh.clip), steps);
        composed::block_stack reference(sh, offload_settings{}, s); // offload off: every activation in memory of its own
        const trace by_hand = train(reference, steps, s, [&](cudaStream_t st) { reference.step_by_hand(st); });
        bool ok = by_hand.losses.back() < 0.9f * by_hand.losses.front();
        ok = run<no_graphs>("impl none: eager, with the hooks' and copies' lanes", sh, steps, by_hand, s) && ok;
        ok = run<local_graphs>("impl local, capture_regions<\"up\", \"down\">: per-block graphs captured lazily", sh, steps, by_hand, s) && ok;
        ok = run<ahead_of_time>("impl transformer_engine, capture_regions<\"up\", \"down\">: every graph ahead of time", sh, steps, by_hand, s) && ok;
        ok = run<whole_step>("impl full_iteration: the whole step, lanes and copies inside one graph", sh, steps, by_hand, s) && ok;
        std::printf("\n%s\n", ok ? "every run bitwise equal to the hand-written loop, and the loss fell" : "FAIL");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "11_composed_trainer: %s\n", e.what());
        return 1;
    }
}
