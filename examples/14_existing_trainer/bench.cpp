// Tutorial 14's trainer, timed: its own eager loop against per-layer graphs and against the whole
// step as one graph, in which its host-valued regions (the sampler's seed, the head's host-sized
// launch and AdamW's learning rate and bias corrections, all passed by value) are updated before
// each replay. Round-robin in one process, at a launch-bound and a
// compute-bound size; every contender trains the same steps, so their parameters must end equal.
// Timed and counted with the library's step meter (capscope/run/step_meter.hpp): device and host
// time per step, and CUDA API calls per step (CUPTI).
//
//   14_existing_trainer_bench [--rounds N]      exit 77 without a GPU
#include "adopted/trainer.cuh"

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>
#include <capscope/run/step_meter.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

using namespace capscope;

namespace {

int current_layers = 0;            // the shape being timed
in_place_step* current = nullptr; // as adopted/main.cpp: the step the trainer's marks go to

// adopted/main.cpp's marks: the same regions updated in the graph, the same stream for them.
void mark(const char* kind, int layer, bool backward, void (*code)(void*), void* context) {
    const int next[] = {layer + 1};
    const bool host_valued = std::strcmp(kind, "data") == 0 || std::strcmp(kind, "head") == 0;
    const marked_region r{.layer = layer, .kind = stage_kind_id(kind), .updated_in_graph = host_valued,
                          .reads_parameters_of = layer >= 0 && layer + 1 < current_layers && !backward ? list_view<int>(next) : list_view<int>()};
    auto run = [&](cudaStream_t given) {
        const cudaStream_t own = std::exchange(main_stream, host_valued ? given : main_stream);
        code(context);
        main_stream = own;
    };
    backward ? current->backward(r, run) : current->forward(r, run);
}

struct contender {
    const char* name;
    ::model m;
    int at = 0; //!< steps taken
    std::function<void(contender&)> one_step;
    const runner_counters* counters = nullptr;
    std::vector<float> device_ms, host_us; // what capscope::step_meter::time_round_robin appends, per step
    void step(cudaStream_t) { one_step(*this), ++at; }
};

template <class Runner>
std::function<void(contender&)> in_place(Runner& cap) {
    return [&cap](contender& c) {
        marker = &mark;
        in_place_step st = cap.step(main_stream);
        current = &st;
        st.run({.kind = stage_kind_id("zero_grads")}, [&](cudaStream_t) { zero_grads(&c.m); });
        for (int mb = 0; mb < c.m.s.microbatches; ++mb) {
            st.microbatch();
            const batch b = next_batch(c.m.s, c.at, mb);
            forward(&c.m, b, mb);
            backward(&c.m, b, mb);
        }
        st.run({.kind = stage_kind::optimizer, .updated_in_graph = true}, [&](cudaStream_t given) { update(&c.m, c.at, given); });
        st.end();
    };
}

void own_loop(contender& c) {
    marker = nullptr;
    zero_grads(&c.m);
    for (int mb = 0; mb < c.m.s.microbatches; ++mb) {
        const batch b = next_batch(c.m.s, c.at, mb);
        forward(&c.m, b, mb), backward(&c.m, b, mb);
    }
    update(&c.m, c.at, main_stream);
}

bool bench(const char* title, const shape& s, int rounds) {
    in_place_runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>> per_layer;
    in_place_runner<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>> whole;
    std::vector<contender> cs(3);
    cs[0].name = "its own eager loop", cs[0].one_step = own_loop;
    cs[1].name = "per-layer graphs (transformer_engine)", cs[1].one_step = in_place(per_layer), cs[1].counters = &per_layer.counters();
    cs[2].name = "the whole step, one graph", cs[2].one_step = in_place(whole), cs[2].counters = &whole.counters();
    current_layers = s.layers;
    for (contender& c : cs) model_init(&c.m, s, 1234);
    const int per_round = 10;
    step_meter::time_round_robin(cs, 1, 4, main_stream); // recording, warmup and capture, untimed
    for (contender& c : cs) c.device_ms.clear(), c.host_us.clear();
    std::vector<runner_counters> before;
    for (contender& c : cs) before.push_back(c.counters ? *c.counters : runner_counters{});
    step_meter::time_round_robin(cs, rounds, per_round, main_stream);
    // Its CUDA API calls per step, counted in a step of their own (the callbacks cost host time).
    std::vector<step_meter::api_calls> calls;
    for (contender& c : cs) calls.push_back(step_meter::api_counter().count([&] { c.step(main_stream); }));
    CHECK_CUDA(cudaStreamSynchronize(main_stream));
    const std::vector<float> want = read_parameters(&cs[0].m);
    bool same = true;
    printf("\n%s: %d layers, width %d, hidden %d, %d rows, %d microbatches; median of %d rounds of %d steps\n", title, s.layers, s.width,
           s.hidden, s.rows, s.microbatches, rounds, per_round);
    for (std::size_t i = 0; i < cs.size(); ++i) {
        contender& c = cs[i];
        const std::vector<float> got = read_parameters(&c.m);
        const bool equal = got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
        same = same && equal;
        const double ms = step_meter::median(c.device_ms), base = step_meter::median(cs[0].device_ms);
        printf("  %-38s %8.3f ms/step  %5.2fx  host %7.1f us/step  %5ld CUDA API calls/step", c.name, ms, base / ms,
               step_meter::median(c.host_us), calls[i].total());
        if (c.counters && c.counters->graph_updates > before[i].graph_updates) {
            const double steps = double(rounds * per_round);
            printf("  (updated in the graph: %.0f regions, %.1f us of host time per step)", double(c.counters->graph_updates - before[i].graph_updates) / steps,
                   double(c.counters->update_us - before[i].update_us) / steps);
        }
        printf("%s\n", equal ? "" : "   PARAMETERS DIFFER");
    }
    for (contender& c : cs) model_free(&c.m);
    return same;
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 7;
    if (argc == 3 && std::strcmp(argv[1], "--rounds") == 0) rounds = std::max(1, std::atoi(argv[2]));
    else if (argc != 1) return printf("usage: 14_existing_trainer_bench [--rounds N]\n"), 2;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return printf("no usable CUDA device: skipped\n"), 77;
    CHECK_CUDA(cudaStreamCreate(&main_stream));
    CHECK_CUBLAS(cublasCreate(&cublas));
    CHECK_CUBLAS(cublasSetStream(cublas, main_stream));
    bool same = bench("launch-bound", shape{8, 128, 512, 64, 2}, rounds);
    same = bench("compute-bound", shape{4, 1024, 4096, 4096, 2}, rounds) && same;
    printf("\n%s\n", same ? "every contender's parameters bitwise equal" : "FAIL: the contenders' parameters differ");
    CHECK_CUBLAS(cublasDestroy(cublas));
    CHECK_CUDA(cudaStreamDestroy(main_stream));
    return same ? 0 : 1;
}
