// Tutorial 09: activation offload inside the graphs (Megatron's
// `--fine-grained-activation-offloading --offload-modules qkv_linear core_attn attn_proj mlp_norm
// --delay-offload-until-cuda-graph` under `--cuda-graph-impl transformer_engine`).
//
// Each layer keeps tensors for its backward. With offload, the ones the policy names go to a
// pinned host pool after the layer's forward and come back before its backward; meanwhile their
// device bytes (a small ring of slots per name) hold later layers' tensors. The copies are
// stages on side lanes, captured in the graphs with the compute. This tutorial trains the
// reverse task twice from the same weights and data, without offload and with it, and prints
// the plan with its copies, the device memory of each run, their step times, and whether the
// losses are the same bits.
//
//   09_activation_offload [--dot FILE]
//
// Exits 1 unless both runs learn and give identical losses, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cstring>
#include <string>
#include <vector>

using namespace capscope;
using om = offload_module;

// [snippet config]
// Whole layers, captured ahead of time. The copies out of a layer are a graph of their own,
// launched right after the layer's (delay_offload_until_cuda_graph), so they overlap the next
// layer. Megatron's default min_offloaded_tensor_size (2^20 elements) applies; every tensor this
// model keeps is at least that here.
using te = impl::ahead_of_time_per_layer;
using attention_set = offload_modules<om::qkv_linear, om::core_attn, om::attn_proj, om::mlp_norm>;
using offloaded = config<te, modules<>, model<layers<6>>, offload<attention_set, delay_offload_until_cuda_graph>>;
using on_device = config<te, modules<>, model<layers<6>>>;
// [snippet config]

struct run_result {
    std::vector<float> losses;
    double device_mib = 0, step_ms = 0;
};

//! Trains 200 steps of the reverse task under `Config` and measures device memory (the model
//! allocates everything up front, so what is in use after the first replays is the peak).
//! With `show_plan`, prints the runner's plan first and writes its DOT to `dot` (if given).
template <class Config> run_result train(cudaStream_t s, bool show_plan, const std::string& dot = "", int steps = 200) {
    std::size_t free_before = 0, free_after = 0, total = 0;
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    CAPSCOPE_CHECK(cudaMemGetInfo(&free_before, &total));
    // [snippet runner]
    // Tokens 256 x 16 = 4096 rows of width 256: each kept tensor is 2^20 elements (the packed QKV 3 x 2^20).
    gpt::gpt_model<float> model(tutorial::reverse_task_model("DDDDDD", 256, 256, 1), s, std::nullopt,
                                {Config::normalized.offload, offload_ring{}});
    model.set_optimizer({3e-3f}, s);
    runner<Config, gpt::schemas::drop_and_pad_model> r(model.training_program(capture_scope_of<Config>));
    // [snippet runner]
    if (show_plan) {
        std::fputs(r.plan_text().c_str(), stdout);
        tutorial::write_dot(dot, r.plan_dot());
    }
    run_result out;
    std::mt19937 rng(9);
    for (int step = 1; step <= steps; ++step) {
        tutorial::feed(model, rng, s);
        r.step(s);
        out.losses.push_back(model.loss(s));
        if (step == 4) {
            CAPSCOPE_CHECK(cudaMemGetInfo(&free_after, &total));
            out.device_mib = double(free_before - free_after) / 1048576.0;
        }
    }
    if (steps < 200) return out;
    out.step_ms = tutorial::median_step_ms(model, rng, s, 50, [&] { r.step(s); });
    if (Config::normalized.offload.enabled) {
        const auto& store = model.activations();
        const auto& plan = store.plan();
        const double mib = 1048576.0;
        std::printf("offload plan: %d groups copied, %.1f MiB out and back per step; kept tensors on the device %.1f MiB instead of %.1f "
                    "(%.1f MiB saved); pinned host pool %.1f MiB\n",
                    plan.copied_groups(), double(plan.copied_bytes()) / mib, double(store.device_bytes()) / mib,
                    double(plan.bytes_without_offload) / mib, double(plan.device_bytes_saved()) / mib, double(store.host_bytes()) / mib);
    }
    return out;
}

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 09_activation_offload [--dot FILE]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        // The context loads kernels on first use and cuBLAS sets itself up once: a short run
        // first keeps those one-time allocations out of both figures.
        train<on_device>(s, /*show_plan=*/false, "", /*steps=*/4);
        const run_result with = train<offloaded>(s, /*show_plan=*/true, args.dot.empty() ? "" : args.dot[0]);
        const run_result without = train<on_device>(s, /*show_plan=*/false);
        const bool same = with.losses.size() == without.losses.size() &&
                          std::memcmp(with.losses.data(), without.losses.data(), with.losses.size() * sizeof(float)) == 0;
        for (int step : {1, 50, 100, 200})
            std::printf("step %4d  loss %.4f with offload, %.4f without\n", step, with.losses[std::size_t(step - 1)],
                        without.losses[std::size_t(step - 1)]);
        std::printf("device memory in use: %.1f MiB without offload, %.1f MiB with (%.1f MiB less)\n", without.device_mib, with.device_mib,
                    without.device_mib - with.device_mib);
        std::printf("step time (median of 50): %.3f ms without offload, %.3f ms with (%.2fx)\n", without.step_ms, with.step_ms,
                    with.step_ms / without.step_ms);
        const bool learnt = with.losses.back() < 0.5f * with.losses.front();
        std::printf("200 losses identical bit for bit: %s; loss %.4f -> %.4f: %s\n", same ? "yes" : "NO", with.losses.front(),
                    with.losses.back(), learnt ? "learnt" : "LOSS DID NOT FALL ENOUGH");
        return same && learnt ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "09_activation_offload: %s\n", e.what());
        return 1;
    }
}
