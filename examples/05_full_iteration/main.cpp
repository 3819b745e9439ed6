// Tutorial 05: the whole training step as one CUDA graph (Megatron's
// `--cuda-graph-impl full_iteration`): zeroing the gradients, two microbatches' forward and
// backward (gradients accumulate), and the AdamW step, with a learning-rate schedule.
//
// A graph replays the values it was captured with. The learning rate therefore lives in device
// memory: `set_optimizer` writes it between replays (one small launch, outside the graph), and
// the captured AdamW step reads it. The step count for the bias corrections lives there too.
//
//   05_full_iteration [--dot FILE]
//
// Exits 1 unless the loss falls, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cmath>

using namespace capscope;

// [snippet config]
// full_iteration needs Megatron's NaN check off (rule A1: it would synchronize inside the graph);
// tutorial 12 keeps a check on the device instead (nan_check_on_device).
using whole_step = config<impl::whole_iteration, no_nan_check, model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<1.5>, pad_to_capacity>>;
// [snippet config]

//! Linear warmup over 20 steps, then cosine decay to 10% at step 300.
float learning_rate(int step) {
    const float peak = 3e-3f;
    if (step < 20) return peak * float(step + 1) / 20.f;
    const float progress = float(step - 20) / 280.f;
    return peak * (0.1f + 0.9f * 0.5f * (1.f + std::cos(3.14159265f * std::min(progress, 1.f))));
}

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 05_full_iteration [--dot FILE]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        gpt::gpt_model<__nv_bfloat16> model(tutorial::reverse_task_model("DEMD", 128, 32, 2), s);
        // [snippet loop]
        runner<whole_step, gpt::schemas::drop_and_pad_model> graphed(model.training_program());
        std::fputs(graphed.plan_text().c_str(), stdout);
        tutorial::write_dot(args.dot.empty() ? "" : args.dot[0], graphed.plan_dot());

        std::mt19937 rng(3);
        float first = 0, last = 0;
        for (int step = 0; step < 300; ++step) {
            tutorial::feed(model, rng, s);
            model.set_optimizer({learning_rate(step)}, s); // read by the captured AdamW step
            graphed.step(s);
            if (step == 0 || (step + 1) % 50 == 0) {
                last = model.loss(s);
                if (step == 0) first = last;
                std::printf("step %4d  lr %.2e  loss %.4f  (%s)\n", step + 1, double(learning_rate(step)), last,
                            graphed.counters().replays > 0 ? "replayed graph" : "eager warmup");
            }
        }
        // [snippet loop]
        tutorial::print_counters("full_iteration", graphed.counters());
        runner<config<impl::eager>> eager(model.training_program());
        const double eager_ms = tutorial::median_step_ms(model, rng, s, 50, [&] { eager.step(s); });
        const double graphed_ms = tutorial::median_step_ms(model, rng, s, 50, [&] { graphed.step(s); });
        std::printf("step time (median of 50): eager %.3f ms, whole-step graph %.3f ms (%.2fx)\n", eager_ms, graphed_ms, eager_ms / graphed_ms);
        const bool learnt = last < 0.5f * first;
        std::printf("loss %.4f -> %.4f: %s\n", first, last, learnt ? "learnt" : "LOSS DID NOT FALL ENOUGH");
        return learnt ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "05_full_iteration: %s\n", e.what());
        return 1;
    }
}
