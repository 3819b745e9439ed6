// What the NaN/inf check on the device costs a whole-step replay (capscope's nan_check_on_device:
// a finite check of loss and gradients, the optimizer guarded by it as a conditional node), against
// the same step without a check (no_nan_check), timed round-robin in one process. The goal is at
// most 1% of the step. Then fp16, where the check comes with dynamic loss scaling (the head scales
// the loss gradient, AdamW divides it out, a stage after the optimizer updates the scale): without
// either, with the check alone, with both at scale 1 (the scaling's kernels at work, the values as
// unscaled), and with both at 2^16 (the values a real fp16 run has: unscaled, most of fp16's small
// activation gradients are zero, which the GPU computes on faster).
//
//   finite_check [--layers L] [--batch B] [--rounds R]

#include "arguments.hpp"
#include "dense_model.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace capscope;

int layer_count = 12, batch = 2;

//! scale 0: no loss scaling; otherwise dynamic loss scaling from that scale.
gpt::model_config bench_model(bool check, float scale) {
    gpt::model_config c = bench::dense_model(1024, batch, layer_count);
    c.check_finite_on_device = check;
    c.loss_scale.dynamic = scale > 0;
    if (scale > 0) c.loss_scale.initial = scale;
    return c;
}

//! One timed step, of either precision.
struct variant {
    std::shared_ptr<void> model;
    std::function<void(cudaStream_t)> run;
    std::function<int(cudaStream_t)> skipped_steps;
    std::function<float(cudaStream_t)> scale;
    std::vector<float> device_ms, host_us;
    std::string name;
    void step(cudaStream_t s) { run(s); }
};

template <class T, class Config> variant build(std::string name, bool check, float scale, cudaStream_t s) {
    variant v;
    v.name = std::move(name);
    auto m = std::make_shared<gpt::gpt_model<T>>(bench_model(check, scale), s);
    bench::random_batches(*m, 7, s);
    m->set_optimizer({}, s);
    auto r = std::make_shared<runner<Config>>(m->training_program());
    v.run = [r](cudaStream_t st) { r->step(st); };
    v.skipped_steps = [m](cudaStream_t st) { return m->skipped_steps(st); };
    v.scale = [m](cudaStream_t st) { return m->loss_scale(st).scale; };
    v.model = m;
    for (int i = 0; i < 3; ++i) v.step(s); // warmup and capture
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return v;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 10;
    bench::arguments("finite_check").integer("--layers", layer_count, 1).integer("--batch", batch, 1).integer("--rounds", rounds, 1).parse_or_exit(argc, argv);
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    std::printf("%s; h1024 s2048 b%d, %d dense layers, impl full_iteration; %d rounds of 5 steps each, round-robin over the six\n",
                gpu.c_str(), batch, layer_count, rounds);
    using unchecked = config<impl::whole_iteration, warmup_steps<1>, no_nan_check>;
    using checked = config<impl::whole_iteration, warmup_steps<1>, nan_check_on_device>;
    std::vector<variant> v;
    v.push_back(build<__nv_bfloat16, unchecked>("bf16, no check (no_nan_check)", false, 0, s));
    v.push_back(build<__nv_bfloat16, checked>("bf16, the check on the device (nan_check_on_device)", true, 0, s));
    v.push_back(build<__half, unchecked>("fp16, no check, no loss scaling", false, 0, s));
    v.push_back(build<__half, checked>("fp16, the check alone", true, 0, s));
    v.push_back(build<__half, checked>("fp16, the check and loss scaling at scale 1", true, 1.f, s));
    v.push_back(build<__half, checked>("fp16, the check and loss scaling from 2^16", true, 65536.f, s));
    bench::time_round_robin(v, rounds, 5, s);
    for (const variant& x : v)
        std::printf("%-54s %8.3f ms (host %6.1f us); steps skipped %d\n", x.name.c_str(), bench::median(x.device_ms), bench::median(x.host_us),
                    x.skipped_steps(s));
    const auto cost = [&](std::size_t with, std::size_t without) {
        return 100.0 * (bench::median(v[with].device_ms) / bench::median(v[without].device_ms) - 1.0);
    };
    std::printf("bf16: the check costs %+.2f%% of the step (goal: at most 1%%)\n", cost(1, 0));
    std::printf("fp16: the check costs %+.2f%%; loss scaling's kernels %+.2f%% more (scale 1 against the check alone); the values "
                "a scale of 2^16 gives %+.2f%% more; all of it %+.2f%% (scale now %.0f)\n",
                cost(3, 2), cost(4, 3), cost(5, 4), cost(5, 2), double(v[5].scale(s)));
    return 0;
}
