// Tutorial 03: capture part of each layer of a dense model, lazily (Megatron's
// `--cuda-graph-impl local --cuda-graph-modules attn mlp`), and watch what the runner does.
//
// The model trains on the reverse task (tutorial 02). The config is a type: the compiler
// checks it against the rule table, and the runner checks each layer kind's plan against the
// model's layer schemas. The runner prints its plan, runs 3 eager warmup steps, captures each
// graphed segment the first time it runs, and replays it after that.
//
//   03_partial_capture [--dot FILE]
//
// Exits 1 unless the loss falls, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

using namespace capscope;

// [snippet config]
// attn + mlp: the attention and MLP stages of each dense layer. They are consecutive, so each
// layer becomes one forward graph and one backward graph.
using partial = config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, model<layers<6>>>;
// [snippet config]
using eager_cfg = config<impl::eager, model<layers<6>>>;

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 03_partial_capture [--dot FILE]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        // [snippet train]
        gpt::gpt_model<float> model(tutorial::reverse_task_model("DDDDDD", 128, 64, 1), s);
        model.set_optimizer({3e-3f}, s);
        runner<partial, gpt::schemas::drop_and_pad_model> graphed(model.training_program());
        std::fputs(graphed.plan_text().c_str(), stdout);
        tutorial::write_dot(args.dot.empty() ? "" : args.dot[0], graphed.plan_dot());

        std::mt19937 rng(42);
        float first = 0, last = 0;
        for (int step = 1; step <= 200; ++step) {
            tutorial::feed(model, rng, s);
            graphed.step(s);
            if (step == 1 || step % 50 == 0) {
                last = model.loss(s);
                if (step == 1) first = last;
                std::printf("step %4d  loss %.4f  (graphs alive: %d)\n", step, last, graphed.graphs_alive());
            }
        }
        // [snippet train]
        tutorial::print_counters("attn+mlp, local", graphed.counters());

        runner<eager_cfg> eager(model.training_program());
        const double eager_ms = tutorial::median_step_ms(model, rng, s, 50, [&] { eager.step(s); });
        const double graphed_ms = tutorial::median_step_ms(model, rng, s, 50, [&] { graphed.step(s); });
        std::printf("step time (median of 50): eager %.3f ms, graphed %.3f ms (%.2fx)\n", eager_ms, graphed_ms, eager_ms / graphed_ms);
        const bool learnt = last < 0.5f * first;
        std::printf("loss %.4f -> %.4f: %s\n", first, last, learnt ? "learnt" : "LOSS DID NOT FALL ENOUGH");
        return learnt ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "03_partial_capture: %s\n", e.what());
        return 1;
    }
}
