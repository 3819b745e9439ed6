// What graphs cost besides their replays: device memory and start-up, per impl, for the example
// model (issue 33, items 2 and 3; capscope's side). For each impl, in turn and on a fresh model:
// - memory: device memory in use (cudaMemGetInfo) with the model alone, then at steady replay;
//   the difference is everything the runner and its graphs add (executable graphs, the scratch
//   pool, CUDA's graph memory pool, whose high-water mark is printed too);
// - start-up: the wall time from building the runner to steady steps (warmup, captures,
//   instantiations), with capture and instantiation apart (the runner's counters: totals, and
//   the longest single one). Measured as bench/peers/gpt_peer.py --startup measures PyTorch's
//   variants: each step synchronized, the steady step the median of the last ten of 25, and
//   steady replay beginning at the first step from which every later one takes at most 1.25
//   steady steps.
// The model is bench/same_model's (vocab 256, heads of 64, ffn 4 x hidden, bf16), dense.
//
//   graph_cost [--layers L] [--hidden H] [--batch B] [--microbatches M]

#include "arguments.hpp"
#include "dense_model.hpp"
#include "round_robin.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

int layer_count = 24, hidden = 1024, batch = 1, microbatches = 2;

double mib(std::size_t bytes) { return double(bytes) / 1048576.0; }

//! Device memory in use once everything issued so far is done.
std::size_t device_used() {
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    return bench::device_used();
}

double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

template <class Config> void measure(const char* name, cudaStream_t s, bool print = true) {
    gpt::gpt_model<T> model(bench::dense_model(hidden, batch, layer_count, microbatches), s);
    bench::random_batches(model, 5, s);
    model.set_optimizer({}, s);
    const std::size_t model_alone = device_used();

    const auto start = std::chrono::steady_clock::now();
    auto r = std::make_unique<runner<Config>>(model.training_program());
    const double plan_ms = ms_since(start);
    std::vector<double> ends; // ms since start, at the end of each step
    for (int i = 0; i < 25; ++i) {
        r->step(s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        ends.push_back(ms_since(start));
    }
    std::vector<double> durations{ends[0]};
    for (std::size_t i = 1; i < ends.size(); ++i) durations.push_back(ends[i] - ends[i - 1]);
    std::vector<double> last(durations.end() - 10, durations.end());
    std::sort(last.begin(), last.end());
    const double step_ms = 0.5 * (last[4] + last[5]);
    std::size_t first = 0;
    for (std::size_t i = durations.size(); i-- > 0;)
        if (durations[i] > 1.25 * step_ms) {
            first = i + 1;
            break;
        }
    if (first >= ends.size()) first = ends.size() - 1; // the last step was slow too: count to the end (a floor)
    const double startup_ms = ends[first] - step_ms;
    const std::size_t steady = device_used();
    for (int i = 0; i < 5; ++i) r->step(s); // memory must not grow with replays
    const std::size_t after = device_used();

    int device = 0;
    CAPSCOPE_CHECK(cudaGetDevice(&device));
    std::size_t graph_pool_high = 0;
    CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &graph_pool_high));
    const runner_counters& c = r->counters();
    if (!print) return;
    const double added = mib(steady) - mib(model_alone);
    std::printf("%-20s | %4d graphs | memory: model %8.1f MiB, + runner and graphs %7.1f MiB (%+.2f%%; CUDA graph pool high %.1f MiB), "
                "unchanged over 5 more steps: %s | start-up %8.1f ms (plan %.1f ms; %ld captures %.1f ms, longest %.2f ms; %ld "
                "instantiations %.1f ms, longest %.2f ms) = %.1f steady steps of %.2f ms | device memory in use %.1f MiB\n",
                name, r->plan().graph_count, mib(model_alone), added, 100.0 * added / mib(model_alone), mib(graph_pool_high),
                after == steady ? "yes" : "NO", startup_ms, plan_ms, c.captures, c.capture_us / 1e3, c.longest_capture_us / 1e3,
                c.instantiations, c.instantiate_us / 1e3, c.longest_instantiate_us / 1e3, startup_ms / step_ms, step_ms, mib(after));
    std::fflush(stdout);
    r.reset();
    CAPSCOPE_CHECK(cudaDeviceGraphMemTrim(device));
    std::uint64_t zero = 0; // resets the high-water mark for the next impl
    CAPSCOPE_CHECK(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
}

} // namespace

int main(int argc, char** argv) {
    const bench::arguments args = bench::arguments("graph_cost")
                                      .integer("--layers", layer_count, 1)
                                      .integer("--hidden", hidden, 64)
                                      .integer("--batch", batch, 1)
                                      .integer("--microbatches", microbatches, 1);
    args.parse_or_exit(argc, argv);
    if (hidden % 64) args.refuse("--hidden " + std::to_string(hidden) + " is not a whole number of heads of 64: give a multiple of 64");
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    std::printf("%s; bf16 h%d s2048 b%d x %d microbatches, %d dense layers; one impl at a time, each on a fresh model\n", gpu.c_str(),
                hidden, batch, microbatches, layer_count);
    using w1 = warmup_steps<1>;
    // Once, not printed: the process's first steps load the kernels and set up cuBLAS, which no
    // impl should be charged with.
    measure<config<impl::eager>>("process warm-up", s, false);
    measure<config<impl::eager>>("none", s);
    measure<config<impl::lazy_per_layer, modules<>, w1>>("local, whole layers", s);
    measure<config<impl::ahead_of_time_per_layer, modules<>, w1>>("transformer_engine", s);
    measure<config<impl::whole_iteration, no_nan_check, w1>>("full_iteration", s);
    return 0;
}
