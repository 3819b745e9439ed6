// Tutorial 04: capture an MoE model. Under drop-and-pad every expert has a fixed capacity, so
// the router and the token permutation (`moe_router`, `moe_preprocess`) can be captured with
// the attention. Under dropless MoE the permutation reads the per-expert counts back to the
// host to size the expert GEMMs: capturing it cannot work, and the plan says so before any
// capture, with the fix. Capturing `attn` + `moe_router` only works. Or, in capscope's engine,
// the dropless model gets a static capacity per expert (`static_expert_capacity`,
// model_config::dropless_capacity_factor): `moe` is captured whole, and a step in which an
// expert gets more tokens is refused on the device and rerun eagerly.
//
//   04_moe_capture [--dot FILE_DROP_AND_PAD [--dot FILE_DROPLESS [--dot FILE_STATIC_CAPACITY]]]
//
// Exits 1 unless the three models learn and the dropless plan error was raised, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

using namespace capscope;

// [snippet configs]
using moe_facts = model<experts<4>, moe_pattern<0, 1, 0, 1>, capacity_factor<1.5>, pad_to_capacity>;
using dropless_facts = model<experts<4>, moe_pattern<0, 1, 0, 1>>;
// transformer_engine: every graph captured ahead of time, in schedule order.
using router_and_preprocess = config<impl::ahead_of_time_per_layer,
                                     modules<capture::attention, capture::moe_router, capture::moe_preprocess>, moe_facts>;
using dropless_router_and_preprocess = config<impl::ahead_of_time_per_layer,
                                              modules<capture::attention, capture::moe_router, capture::moe_preprocess>, dropless_facts>;
using dropless_router_only = config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>, dropless_facts>;
// [snippet configs]
// [snippet static_capacity_config]
using dropless_static_capacity =
    config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe>, dropless_facts, static_expert_capacity>;
// [snippet static_capacity_config]

template <class Config, class Schemas>
float train(gpt::gpt_model<float>& model, cudaStream_t s, const char* what, const std::string& dot, float* first) {
    runner<Config, Schemas> r(model.training_program());
    std::fputs(r.plan_text().c_str(), stdout);
    tutorial::write_dot(dot, r.plan_dot());
    std::mt19937 rng(7);
    float last = 0;
    for (int step = 1; step <= 150; ++step) {
        tutorial::feed(model, rng, s);
        r.step(s);
        if (step == 1 || step % 50 == 0) {
            last = model.loss(s);
            if (step == 1) *first = last;
            std::printf("step %4d  loss %.4f\n", step, last);
        }
    }
    tutorial::print_counters(what, r.counters());
    runner<config<impl::eager>> eager(model.training_program());
    const double eager_ms = tutorial::median_step_ms(model, rng, s, 30, [&] { eager.step(s); });
    const double graphed_ms = tutorial::median_step_ms(model, rng, s, 30, [&] { r.step(s); });
    std::printf("step time (median of 30): eager %.3f ms, graphed %.3f ms (%.2fx)\n\n", eager_ms, graphed_ms, eager_ms / graphed_ms);
    return last;
}

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 04_moe_capture [--dot FILE_DROP_AND_PAD [--dot FILE_DROPLESS [--dot FILE_STATIC_CAPACITY]]]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        bool ok = true;

        std::puts("== drop-and-pad: attn + moe_router + moe_preprocess ==");
        auto cfg = tutorial::reverse_task_model("DEDE", 128, 64, 1);
        cfg.moe_mode = gpt::moe_mode::drop_and_pad;
        gpt::gpt_model<float> padded(cfg, s);
        padded.set_optimizer({3e-3f}, s);
        float first = 0;
        float last = train<router_and_preprocess, gpt::schemas::drop_and_pad_model>(padded, s, "drop-and-pad", args.dot.empty() ? "" : args.dot[0], &first);
        ok = ok && last < 0.5f * first;

        std::puts("== dropless: the same modules cannot work ==");
        cfg.moe_mode = gpt::moe_mode::dropless;
        gpt::gpt_model<float> dropless(cfg, s);
        dropless.set_optimizer({3e-3f}, s);
        try {
            runner<dropless_router_and_preprocess> r(dropless.training_program());
            std::puts("UNEXPECTED: the plan accepted a host-synchronizing stage inside a graph");
            ok = false;
        } catch (const plan_error& e) {
            std::printf("plan error (before any capture):\n  %s\n\n", e.what());
        }
        // With the dropless schemas, naming the bad config in a runner does not even compile:
        //   runner<dropless_router_and_preprocess, gpt::schemas::dropless_model>
        //   error: static assertion failed: capscope plan rule P1: stage moe_preprocess synchronizes with the host, ...
        std::puts("== dropless: attn + moe_router, as the fix says ==");
        last = train<dropless_router_only, gpt::schemas::dropless_model>(dropless, s, "dropless", args.dot.size() > 1 ? args.dot[1] : "", &first);
        ok = ok && last < 0.5f * first;

        std::puts("== dropless with a static capacity (1.5 x the mean): attn + moe, a step past it rerun ==");
        // [snippet static_capacity_run]
        cfg.dropless_capacity_factor = 1.5;
        gpt::gpt_model<float> static_capacity(cfg, s);
        static_capacity.set_optimizer({3e-3f}, s);
        last = train<dropless_static_capacity, gpt::schemas::dropless_static_model>(static_capacity, s, "dropless, static capacity",
                                                                                    args.dot.size() > 2 ? args.dot[2] : "", &first);
        // [snippet static_capacity_run]
        ok = ok && last < 0.5f * first;
        std::printf("%s\n", ok ? "the three models learnt" : "FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "04_moe_capture: %s\n", e.what());
        return 1;
    }
}
