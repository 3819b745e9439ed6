// Tutorial 02: train the example model, eagerly, on a task with something to learn.
//
// Task: reverse a sequence. Each sample is 8 random symbols, a separator, then the same 8
// symbols reversed; the loss is on the reversed half only. A model that has not learnt
// guesses among 14 symbols (loss ln 14 = 2.64); one that has learnt to attend to position
// 16 - i gets close to 0. The layer pattern mixes all three layer kinds: dense, MoE, Mamba.
//
//   02_train_reverse [fp32|bf16|fp16] [drop_and_pad|dropless] [steps]
//
// fp16 trains here as it is, without loss scaling: this small task's gradients stay within fp16's
// range. Tutorial 12 shows fp16 with dynamic loss scaling, which a real model needs.
//
// Prints the loss every 25 steps, and exits 1 unless the final loss is under half the first
// (so the build's test suite can run it), 77 when there is no GPU.

#include "../common/tutorial.hpp"

#include <gpt/model.hpp>

#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>

#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace {

template <class T> int train(const gpt::model_config& cfg, int steps) {
    capscope::cuda::stream s;
    // [snippet loop]
    gpt::gpt_model<T> model(cfg, s);
    std::printf("model: %zu parameters, layers \"%s\" (D dense, E MoE, M Mamba), %d stages:", model.parameters().total(),
                cfg.layer_pattern.c_str(), int(model.stages().size()));
    for (const auto& st : model.stages()) std::printf(" %s", st.name.c_str());
    std::printf("\n");
    std::mt19937 rng(42);
    gpt::adamw_config opt;
    opt.lr = 3e-3f;
    float first = 0, last = 0;
    for (int step = 1; step <= steps; ++step) {
        tutorial::feed(model, rng, s);
        model.zero_grad(s);
        model.forward(s);
        model.backward(s);
        model.optimizer_step(s, opt);
        if (step == 1 || step % 25 == 0) {
            last = model.loss(s);
            if (step == 1) first = last;
            std::printf("step %4d  loss %.4f\n", step, last);
        }
    }
    // [snippet loop]
    const bool learnt = last < 0.5f * first;
    std::printf("loss %.4f -> %.4f: %s\n", first, last, learnt ? "the model learnt to reverse" : "LOSS DID NOT FALL ENOUGH");
    return learnt ? 0 : 1;
}

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "02_train_reverse: %s\nusage: 02_train_reverse [fp32|bf16|fp16] [drop_and_pad|dropless] [steps]\n", why);
    std::exit(2);
}

} // namespace

int main(int argc, char** argv) {
    if (argc > 4) usage("too many arguments");
    const std::string precision = argc > 1 ? argv[1] : "fp32";
    const std::string mode = argc > 2 ? argv[2] : "drop_and_pad";
    int steps = 300;
    if (precision != "fp32" && precision != "bf16" && precision != "fp16") usage(("unknown precision '" + precision + "'").c_str());
    if (mode != "drop_and_pad" && mode != "dropless") usage(("unknown MoE mode '" + mode + "'").c_str());
    if (argc > 3) {
        char* end = nullptr;
        const long v = std::strtol(argv[3], &end, 10);
        if (*end != '\0' || v < 1 || v > 100000) usage(("steps must be an integer in [1, 100000], got '" + std::string(argv[3]) + "'").c_str());
        steps = int(v);
    }
    if (capscope::cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return capscope::cuda::skip_exit_code;
    }
    gpt::model_config cfg = tutorial::reverse_task_model("DEMD", 128, 64, 1);
    cfg.moe_mode = mode == "dropless" ? gpt::moe_mode::dropless : gpt::moe_mode::drop_and_pad;
    std::printf("training to reverse %d symbols: %s, MoE %s, %d steps\n", tutorial::symbols, precision.c_str(), mode.c_str(), steps);
    try {
        if (precision == "bf16") return train<__nv_bfloat16>(cfg, steps);
        if (precision == "fp16") return train<__half>(cfg, steps);
        return train<float>(cfg, steps);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "02_train_reverse: %s\n", e.what());
        return 1;
    }
}
