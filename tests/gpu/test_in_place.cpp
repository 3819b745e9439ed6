// Capture scopes marked in place (capscope/run/in_place_runner.hpp): a loop-first trainer keeps
// its forward and backward functions and marks its regions where they stand. Under all four impls
// it is bitwise equal to its own loop; a step whose regions differ from the recorded ones is
// refused naming the first difference (and record_again() takes the new order); CUDA work between
// two regions of one graph is named by the capture doctor before any capture, and by the capture
// itself without the doctor; the doctor names a region that launches on the legacy stream; a
// composition's hooks apply to the recorded program; replayed steps allocate nothing on the host;
// with NCCL's graph mixing off, an eager collective region waits for the layers' graphs.

#include "count_host_allocations.hpp"
#include "engine_kernels.hpp"
#include "scoped_environment.hpp"
#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;
using ints = cuda::device_buffer<int>;

namespace {

constexpr int n = 512, layers = 3, microbatches = 2, steps = 6;
constexpr int block_calls_per_step = layers * microbatches; // forward calls of a block region in one step

//! Where a loop-first trainer's code does CUDA work it should not.
enum class fault { none, gap_in_graph, legacy_launch, skip_layer1, moved_buffer, guarded_global, guarded_given };

//! The trainer's own marks: none at all (its eager loop, as it was), or an in_place_step's.
struct no_marks {
    cudaStream_t s;
    template <class F>
    void run(const marked_region&, F&& f) { f(s); }
    void microbatch() {}
    template <class F>
    void forward(const marked_region&, F&& f) { f(s); }
    template <class F>
    void backward(const marked_region&, F&& f) { f(s); }
};

//! A loop-first trainer on integers (every result exact): forward and backward own the layer
//! loop; block l's kernel also adds block l + 1's weights (fused across the block boundary).
struct loop_trainer {
    ints counter{1}, w[layers] = {ints(n), ints(n), ints(n)}, g[layers] = {ints(n), ints(n), ints(n)};
    ints x[layers + 1] = {ints(n), ints(n), ints(n), ints(n)}, tmp{n}, out{n}, elsewhere{n}, all_finite{1};
    cudaStream_t global; //!< the trainer's own stream, a global it keeps using inside its regions
    fault f = fault::none;
    bool scaled = false; //!< each block followed by a region with a host value and a host-sized launch
    int step_index = 0;

    explicit loop_trainer(cudaStream_t s) : global(s) {
        for (ints* b : {&counter, &tmp, &out, &elsewhere}) b->fill_bytes(0, s);
        k::fill_from(all_finite.data(), counter.data(), 1, 1, s); // 1: the guarded optimizer runs
        for (int l = 0; l < layers; ++l) {
            k::fill_from(w[l].data(), counter.data(), l + 1, n, s);
            g[l].fill_bytes(0, s);
        }
    }
    template <class Step>
    void forward(Step& step, int mb) {
        // Undeclared (no buffer lists): its lambda holds the microbatch, so no graph may be shared.
        step.forward({.kind = stage_kind::embedding}, [&](cudaStream_t) { k::fill_from(x[0].data(), counter.data(), 7 * mb, n, global); });
        if (f == fault::gap_in_graph && step_index >= 1) k::scale(tmp.data(), x[0].data(), 1, n, global); // between two regions
        for (int l = 0; l < layers; ++l) {
            if (f == fault::skip_layer1 && step_index >= 2 && l == 1) continue;
            const int next[] = {l + 1};
            ints& into = f == fault::moved_buffer && step_index >= 2 && l == 2 ? elsewhere : x[l + 1];
            step.forward({.layer = l, .kind = stage_kind_id("block"),
                          .reads = {{"x", x[l].data(), n * sizeof(int)}},
                          .writes = {{"x next", into.data(), n * sizeof(int)}},
                          .reads_parameters_of = l + 1 < layers ? list_view<int>(next) : list_view<int>()},
                         [&](cudaStream_t) {
                             k::scale(tmp.data(), x[l].data(), 2, n, global);
                             k::add(into.data(), tmp.data(), w[l].data(), n, global);
                             if (l + 1 < layers) k::add(into.data(), into.data(), w[l + 1].data(), n, global);
                             if (f == fault::legacy_launch && l == 1) k::scale(tmp.data(), tmp.data(), 1, n, nullptr);
                         });
            if (scaled) // in the block's graph, recorded again each step: it must use the stream it is given
                step.forward({.layer = l, .kind = stage_kind_id("scaled"), .regions = {"block"}, .updated_in_graph = true},
                             [&](cudaStream_t given) {
                                 const int factor = 1 + (step_index + l) % 3, count = n / 2 + 32 * ((step_index + mb) % 8);
                                 k::scale(into.data(), into.data(), factor, count, given);
                             });
        }
        step.forward({.kind = stage_kind::head, .buffers_declared = true},
                     [&](cudaStream_t) { k::add(out.data(), out.data(), x[layers].data(), n, global); });
    }
    template <class Step>
    void backward(Step& step) {
        for (int l = layers - 1; l >= 0; --l)
            if (f != fault::skip_layer1 || step_index < 2 || l != 1)
                    step.backward({.layer = l, .kind = stage_kind_id("block"), .reads = {{"x next", x[l + 1].data(), n * sizeof(int)}}},
                              [&](cudaStream_t) { k::add(g[l].data(), g[l].data(), x[l + 1].data(), n, global); });
    }
    template <class Step>
    void train_step(Step& step) {
        step.run({.kind = stage_kind_id("zero_grads"), .buffers_declared = true}, [&](cudaStream_t) {
            for (int l = 0; l < layers; ++l) CAPSCOPE_CHECK(cudaMemsetAsync(g[l].data(), 0, n * sizeof(int), global));
        });
        for (int mb = 0; mb < microbatches; ++mb) {
            step.microbatch();
            forward(step, mb);
            backward(step);
        }
        const bool guarded = f == fault::guarded_global || f == fault::guarded_given;
        step.run({.kind = stage_kind::optimizer, .buffers_declared = true,
                  .guard = guarded ? run_if({"all finite", all_finite.data(), sizeof(int)}) : stage_guard{}},
                 [&](cudaStream_t given) {
                     // A guarded body is captured on a stream of its own: it must use the one it is given.
                     const cudaStream_t on = f == fault::guarded_given ? given : global;
                     for (int l = 0; l < layers; ++l) k::add(w[l].data(), w[l].data(), g[l].data(), n, on);
                     k::add_one(counter.data(), on);
                 });
        ++step_index;
    }
    std::vector<int> result() {
        std::vector<int> all = support::download(out.data(), n, global);
        for (int l = 0; l < layers; ++l) {
            const std::vector<int> wl = support::download(w[l].data(), n, global);
            all.insert(all.end(), wl.begin(), wl.end());
        }
        return all;
    }
};

std::vector<int> own_loop(bool scaled = false) {
    cuda::stream s;
    loop_trainer t(s);
    t.scaled = scaled;
    no_marks plain{s};
    for (int i = 0; i < steps; ++i) t.train_step(plain);
    return t.result();
}

template <class Config>
std::vector<int> in_place(runner_counters* counters = nullptr, std::string* plan = nullptr, bool scaled = false) {
    cuda::stream s;
    loop_trainer t(s);
    t.scaled = scaled;
    in_place_runner<Config> cap;
    for (int i = 0; i < steps; ++i) {
        in_place_step step = cap.step(s);
        t.train_step(step);
        step.end();
    }
    if (counters) *counters = cap.counters();
    if (plan) *plan = cap.plan_text();
    return t.result();
}

//! What a step of a runner under `Config`, with fault `f`, throws ("(nothing)" if none).
template <class Config, class Error>
std::string error_of(fault f, int* failing_step = nullptr) {
    cuda::stream s;
    loop_trainer t(s);
    t.f = f;
    in_place_runner<Config> cap;
    for (int i = 0; i < steps; ++i) {
        try {
            in_place_step step = cap.step(s);
            t.train_step(step);
            step.end();
        } catch (const Error& e) {
            if (failing_step) *failing_step = i;
            cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
            CHECK(cudaStreamIsCapturing(s, &status) == cudaSuccess);
            CHECK(status == cudaStreamCaptureStatusNone); // the stream is usable: no capture left open
            return e.what();
        }
    }
    return "(nothing)";
}

using local = config<impl::lazy_per_layer, capture_regions<"block">, warmup_steps<2>>;
using te = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>;
using whole = config<impl::whole_iteration, no_nan_check, warmup_steps<2>>;

} // namespace

TEST_CASE("in place: a loop-first trainer under all four impls is bitwise equal to its own loop") {
    const std::vector<int> expected = own_loop();
    runner_counters c;
    std::string plan;
    CHECK(in_place<config<impl::eager>>() == expected);
    CHECK(in_place<local>(&c, &plan) == expected);
    std::printf("  local: %ld captures, %ld replays, %ld eager segment runs, %ld region calls watched by the doctor\n", c.captures, c.replays,
                c.eager_segment_runs, c.doctor_calls_watched);
    CHECK(c.captures > 0);
    CHECK(c.replays > c.captures);
    CHECK(c.doctor_calls_watched > 0);
    CHECK(plan.find("layer1.block") != std::string::npos);
    CHECK(in_place<te>(&c) == expected);
    CHECK(c.captures > 0);
    CHECK(in_place<whole>(&c, &plan) == expected);
    std::printf("  full_iteration: %ld captures, %ld replays\n%s", c.captures, c.replays, plan.c_str());
    CHECK(c.captures == 1);
    CHECK(c.replays == steps - 2);
}

TEST_CASE("in place: a region with host values and a host-sized launch, updated in the graph, is bitwise equal to the trainer's loop") {
    const std::vector<int> expected = own_loop(true);
    CHECK(own_loop(false) != expected); // the scaled regions change the result
    runner_counters c;
    std::string plan;
    CHECK(in_place<config<impl::eager>>(nullptr, nullptr, true) == expected);
    CHECK(in_place<local>(&c, &plan, true) == expected);
    std::printf("  local: %ld captures, %ld replays, %ld updates in %ld us\n", c.captures, c.replays, c.graph_updates, c.update_us);
    CHECK(c.graph_updates > 0);
    CHECK(plan.find("layer0.scaled [updated before each replay]") != std::string::npos);
    CHECK(in_place<te>(&c, nullptr, true) == expected);
    CHECK(c.graph_updates > 0);
    CHECK(in_place<whole>(&c, nullptr, true) == expected);
    std::printf("  full_iteration: %ld captures, %ld replays, %ld updates in %ld us\n", c.captures, c.replays, c.graph_updates, c.update_us);
    CHECK(c.graph_updates == static_cast<long>(block_calls_per_step * (steps - 3))); // each region, at each replay after the capture
}

TEST_CASE("in place: a step whose regions differ from the recorded ones is refused, naming the first difference") {
    int at = -1;
    const std::string skipped = error_of<local, std::logic_error>(fault::skip_layer1, &at);
    std::printf("  %s\n", skipped.c_str());
    CHECK(at == 2);
    CHECK(skipped.find("the trainer's code reached region 'layer2.block' (forward, microbatch 0), where the recorded step has 'layer1.block'") !=
          std::string::npos);
    CHECK(skipped.find("record_again()") != std::string::npos);
    const std::string moved = error_of<whole, std::logic_error>(fault::moved_buffer, &at);
    std::printf("  %s\n", moved.c_str());
    CHECK(moved.find("region 'layer2.block'") != std::string::npos);
    CHECK(moved.find("its writes are not the recorded ones") != std::string::npos);
    // record_again(): the next step is recorded in its new order, and runs on.
    cuda::stream s;
    loop_trainer t(s);
    t.f = fault::skip_layer1;
    in_place_runner<local> cap;
    for (int i = 0; i < steps; ++i) {
        if (i == 2) cap.record_again();
        in_place_step step = cap.step(s);
        t.train_step(step);
        step.end();
    }
    CHECK(cap.plan_text().find("layer1.block") == std::string::npos);
    CHECK(cap.counters().replays > 0);
}

TEST_CASE("in place: CUDA work between two regions of one graph is named before any capture, and by the capture without the doctor") {
    // Under full_iteration the embedding and layer 0 are in one graph: the doctor names the gap.
    int at = -1;
    const std::string doctor = error_of<whole, plan_error>(fault::gap_in_graph, &at);
    std::printf("  %s\n", doctor.c_str());
    CHECK(at == 1); // the watched (last warmup) step
    CHECK(doctor.find("P20") != std::string::npos);
    CHECK(doctor.find("the code between 'embedding' and 'layer0.block' (graph g0) calls cudaLaunchKernel") != std::string::npos);
    CHECK(doctor.find("mark this code as a region of its own") != std::string::npos);
    // Without the doctor, the capture sees the new work and fails, naming the two regions.
    const std::string capture =
        error_of<config<impl::whole_iteration, no_nan_check, warmup_steps<2>, capture_doctor_off>, capture_failed>(fault::gap_in_graph, &at);
    std::printf("  %s\n", capture.c_str());
    CHECK(at == 2);
    CHECK(capture.find("between regions 'embedding' and 'layer0.block' enqueued CUDA work while graph g0 was being captured") != std::string::npos);
    CHECK(capture.find("tag the stage") == std::string::npos); // the fix is to mark or move the code, not to tag a stage
    // Between graphs (local captures the blocks only), the same work is fine: it runs in its place.
    cuda::stream s;
    loop_trainer t(s), reference(s);
    t.f = reference.f = fault::gap_in_graph;
    no_marks plain{s};
    in_place_runner<local> cap;
    for (int i = 0; i < steps; ++i) {
        in_place_step step = cap.step(s);
        t.train_step(step);
        step.end();
        reference.train_step(plain);
    }
    CHECK(cap.counters().replays > 0);
    CHECK(t.result() == reference.result());
}

TEST_CASE("in place: the doctor names a region that launches on the legacy stream, before any capture") {
    int at = -1;
    const std::string text = error_of<te, plan_error>(fault::legacy_launch, &at);
    std::printf("  %s\n", text.substr(0, 400).c_str());
    CHECK(at == 1);
    CHECK(text.find("stage 'layer1.block' calls cudaLaunchKernel: it launches on the legacy default stream") != std::string::npos);
}

TEST_CASE("in place: a guarded region runs as a conditional node, and the doctor names one that keeps the stream around it") {
    const std::vector<int> expected = own_loop();
    cuda::stream s;
    loop_trainer t(s);
    t.f = fault::guarded_given;
    in_place_runner<whole> cap;
    for (int i = 0; i < steps; ++i) {
        in_place_step step = cap.step(s);
        t.train_step(step);
        step.end();
    }
    CHECK(cap.counters().conditional_nodes == 1);
    CHECK(t.result() == expected);
    int at = -1;
    const std::string text = error_of<whole, plan_error>(fault::guarded_global, &at);
    std::printf("  %s\n", text.substr(0, 300).c_str());
    CHECK(at == 1);
    CHECK(text.find("stage 'optimizer' calls cudaLaunchKernel: it enqueues on stream") != std::string::npos);
}

TEST_CASE("in place: a composition's step hook applies to the recorded program, recorded in a pass of its own") {
    cuda::stream s;
    ints bumps{1};
    bumps.fill_bytes(0, s);
    const auto bump = on_step<step_point::before_optimizer, capturable>("bump", [p = bumps.data()](step_context& c) { k::add_one(p, c.stream()); });
    const hook_pipeline hooks{bump};
    for (int which = 0; which < 2; ++which) {
        bumps.fill_bytes(0, s);
        loop_trainer t(s);
        auto compose = [&](training_program p) { return with_hooks(p, hooks, std::span<const layer_tensors>{}, &capture_scope_of<whole>); };
        in_place_runner<whole> cap({}, {}, compose);
        if (which == 0) {
            CHECK_THROWS_WITH_AS(cap.step(s), doctest::Contains("records in a pass of its own"), std::logic_error);
            continue;
        }
        cap.record([&](in_place_step& step) { t.train_step(step); }); // the regions' code does not run
        t.step_index = 0;
        CHECK(support::download(t.counter.data(), 1, s)[0] == 0);
        for (int i = 0; i < steps; ++i) {
            in_place_step step = cap.step(s);
            t.train_step(step);
            step.end();
        }
        CHECK(cap.program().step_end.front().name == "step.hook.bump"); // before the optimizer
        CHECK(support::download(bumps.data(), 1, s)[0] == steps);
        CHECK(t.result() == own_loop());
    }
}

template <class Config>
long allocations_per_replayed_step() {
    cuda::stream s;
    loop_trainer t(s);
    in_place_runner<Config> cap;
    auto one_step = [&] {
        in_place_step step = cap.step(s);
        t.train_step(step);
        step.end();
    };
    for (int i = 0; i < 4; ++i) one_step(); // recording, the watched warmup step, the capture, one replay
    const long before = host_allocations.load();
    for (int i = 0; i < 5; ++i) one_step();
    return (host_allocations.load() - before) / 5;
}

TEST_CASE("in place: a replayed step allocates nothing on the host") {
    const long local_allocations = allocations_per_replayed_step<local>();
    const long whole_allocations = allocations_per_replayed_step<whole>();
    std::printf("  host allocations per replayed step: local %ld, full_iteration %ld\n", local_allocations, whole_allocations);
    CHECK(local_allocations == 0);
    CHECK(whole_allocations == 0);
}

TEST_CASE("in place, without NCCL's graph mixing: an eager collective region after the layers' graphs runs once they have finished") {
    // With NCCL_GRAPH_MIXING_SUPPORT=0, an eager NCCL call must not follow an unfinished graph
    // launch holding NCCL work (cuda/nccl_graph_mixing.hpp). Here the layers' backward regions
    // declare collective calls (kind "collective") and copy the step's counter into host memory
    // after 2 ms; a collective region at the step's end, eager under transformer_engine, reads it on
    // the host. Broken on purpose (nccl_order_skipped), it reads an earlier step's value.
    const scoped_environment off("NCCL_GRAPH_MIXING_SUPPORT", "0");
    constexpr int blocks = 2;
    cuda::stream s;
    ints counter{1}, tmp{n};
    counter.fill_bytes(0, s);
    tmp.fill_bytes(0, s);
    cuda::pinned_buffer<int> seen(1);
    seen.data()[0] = 0;
    std::vector<int> read;
    in_place_runner<te> cap;
    for (int i = 0; i < steps; ++i) {
        in_place_step step = cap.step(s);
        step.run({.kind = stage_kind_id("count"), .buffers_declared = true}, [&](cudaStream_t on) { k::add_one(counter.data(), on); });
        step.microbatch();
        for (int l = 0; l < blocks; ++l)
            step.forward({.layer = l, .kind = stage_kind_id("block"), .buffers_declared = true}, [&](cudaStream_t on) { k::scale(tmp.data(), tmp.data(), 1, n, on); });
        for (int l = blocks - 1; l >= 0; --l)
            step.backward({.layer = l, .kind = stage_kind_id("collective"), .buffers_declared = true},
                          [&](cudaStream_t on) { k::slow_copy(seen.data(), counter.data(), 1, 2'000'000, on); });
        step.run({.kind = stage_kind_id("collective"), .name = "host read", .buffers_declared = true},
                 [&](cudaStream_t) { read.push_back(int(*static_cast<volatile int*>(seen.data()))); });
        step.end();
    }
    s.synchronize();
    REQUIRE(read.size() == std::size_t(steps));
    CHECK(cap.counters().replays > 0);
    for (int i = 3; i < steps; ++i) { // (the warmup's two steps are eager, and the third captures)
        INFO("step ", i, ": the eager collective region read ", read[std::size_t(i)], " on the host, expected ", i + 1);
        CHECK(read[std::size_t(i)] == i + 1);
    }
    std::printf("  in place, without NCCL's graph mixing: the eager collective region read %d, %d, %d in replayed steps 4-6 (%ld replays)\n",
                read[3], read[4], read[5], cap.counters().replays);
}
