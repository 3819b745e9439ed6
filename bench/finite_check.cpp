// What the NaN/inf check on the device costs a whole-step replay (capscope's nan_check_on_device:
// a finite check of loss and gradients, the optimizer guarded by it as a conditional node), against
// the same step without a check (no_nan_check), timed round-robin in one process. The goal is at
// most 1% of the step.
//
//   finite_check [--layers L] [--batch B] [--rounds R]

#include "dense_model.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

int layer_count = 12, batch = 2;

gpt::model_config bench_model(bool check) {
    gpt::model_config c = bench::dense_model(1024, batch, layer_count);
    c.check_finite_on_device = check;
    return c;
}

struct variant {
    std::unique_ptr<gpt::gpt_model<T>> model;
    std::function<void(cudaStream_t)> run;
    std::vector<float> device_ms, host_us;
    void step(cudaStream_t s) { run(s); }
};

template <class Config> variant build(bool check, cudaStream_t s) {
    variant v;
    v.model = std::make_unique<gpt::gpt_model<T>>(bench_model(check), s);
    bench::random_batches(*v.model, 7, s);
    v.model->set_optimizer({}, s);
    auto r = std::make_shared<runner<Config>>(v.model->training_program());
    v.run = [r](cudaStream_t st) { r->step(st); };
    for (int i = 0; i < 3; ++i) v.step(s); // warmup and capture
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return v;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 10;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--layers" && i + 1 < argc) layer_count = std::atoi(argv[++i]);
        else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else if (a == "--batch" && i + 1 < argc) batch = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: finite_check [--layers L] [--batch B] [--rounds R]\n");
            return 2;
        }
    }
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    std::printf("%s; bf16 h1024 s2048 b%d, %d dense layers, impl full_iteration; %d rounds of 5 steps each, round-robin\n", gpu.c_str(),
                batch, layer_count, rounds);
    std::vector<variant> two;
    two.push_back(build<config<impl::whole_iteration, warmup_steps<1>, no_nan_check>>(false, s));
    two.push_back(build<config<impl::whole_iteration, warmup_steps<1>, nan_check_on_device>>(true, s));
    bench::time_round_robin(two, rounds, 5, s);
    const double base = bench::median(two[0].device_ms), checked = bench::median(two[1].device_ms);
    std::printf("step without a check (no_nan_check):                      %8.3f ms (host %6.1f us)\n", base, bench::median(two[0].host_us));
    std::printf("step with the check on the device (nan_check_on_device):  %8.3f ms (host %6.1f us)\n", checked,
                bench::median(two[1].host_us));
    std::printf("the check costs %+.2f%% of the step (goal: at most 1%%); steps skipped: %d (none expected)\n", 100.0 * (checked / base - 1.0),
                two[1].model->skipped_steps(s));
    return 0;
}
