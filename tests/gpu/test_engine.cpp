// The engine on synthetic stages (integer kernels, exact results): work forked onto a stage's own
// stream and onto the runner's lanes, captured and eager; a failure on a forked stream; which
// capture failures fall back and which are rethrown as they were; the legacy stream; movable
// runners; the bucket runner's scratch arena; and no host allocation on the replay path.
// Every output is poisoned before the call under test, so work that did not run shows.

#include "engine_kernels.hpp"
#include "count_host_allocations.hpp"
#include "support.hpp"
#include "synthetic_stages.hpp"

#include <gpt/inference.hpp>
#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>


using namespace capscope;
namespace k = engine_kernels;

namespace {

constexpr int n = 4096;
using synthetic::ints;
using synthetic::make_stage;
using synthetic::ref;

std::vector<int> get(const ints& b, cudaStream_t s) { return support::download(b.data(), b.size(), s); }
bool all_equal(const std::vector<int>& v, int x) {
    for (int y : v)
        if (y != x) return false;
    return true;
}
void poison(const ints& b, cudaStream_t s) { support::poison(b.data(), b.bytes(), s); }

// ---- lanes: a per-layer reduction on side lane 1 that the optimizer waits for ----------------------

//! Two layers; layer l's forward writes act = step + l, its backward grad = 2 act; a reduction
//! on lane 1 copies grad to red slowly; the optimizer (step end) reads red, so the plan makes it
//! wait for the reductions, and writes
//! out = red0 + red1 = 4 step + 2 (step counted from 1 on the device).
struct laned_model {
    ints counter{1}, out{n};
    ints act[2] = {ints(n), ints(n)}, grad[2] = {ints(n), ints(n)}, red[2] = {ints(n), ints(n)};
    struct layer_fns {
        laned_model* m;
        int l;
        void forward(cudaStream_t s) { k::fill_from(m->act[l].data(), m->counter.data(), l, n, s); }
        void backward(cudaStream_t s) { k::scale(m->grad[l].data(), m->act[l].data(), 2, n, s); }
        void reduce(cudaStream_t s) { k::slow_copy(m->red[l].data(), m->grad[l].data(), n, 200000, s); }
    } fns[2] = {{this, 0}, {this, 1}};
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
    void optimizer(cudaStream_t s) { k::add(out.data(), red[0].data(), red[1].data(), n, s); }

    training_program program() {
        training_program p;
        p.step_begin.push_back(make_stage("advance", -1, {}, stream_fn::of<&laned_model::advance>(this), {}));
        p.microbatches.emplace_back();
        for (int l = 0; l < 2; ++l) {
            const std::string name = "layer" + std::to_string(l);
            // Listed before the layer's work, so that in backward (reverse order) it runs after it.
            stage reduce = make_stage(name + ".reduce", l, {capture_module::mlp}, {}, stream_fn::of<&layer_fns::reduce>(&fns[l]));
            reduce.lane = 1;
            // What it touches: the plan makes the optimizer, which reads red[l], wait for it.
            reduce.buffers_declared = true;
            reduce.backward_inputs = {ref(grad[l])};
            reduce.backward_outputs = {ref(red[l])};
            p.microbatches[0].push_back(std::move(reduce));
            stage work = make_stage(name + ".work", l, {capture_module::mlp}, stream_fn::of<&layer_fns::forward>(&fns[l]),
                                    stream_fn::of<&layer_fns::backward>(&fns[l]));
            work.buffers_declared = true;
            work.inputs = {ref(counter)};
            work.outputs = {ref(act[l])};
            work.backward_outputs = {ref(grad[l])};
            p.microbatches[0].push_back(std::move(work));
        }
        stage opt = make_stage("optimizer", -1, {}, stream_fn::of<&laned_model::optimizer>(this), {});
        opt.buffers_declared = true;
        opt.inputs = {ref(red[0]), ref(red[1])};
        opt.outputs = {ref(out)};
        p.step_end.push_back(std::move(opt));
        return p;
    }
};

template <class Config> void check_lanes(const char* name) {
    cuda::stream s;
    laned_model m;
    m.counter.fill_bytes(0, s);
    runner<Config> r(m.program());
    bool right = true;
    for (int step = 1; step <= 6; ++step) {
        for (const ints& b : m.red) poison(b, s);
        poison(m.out, s);
        r.step(s);
        right = right && all_equal(get(m.out, s), 4 * step + 2) && all_equal(get(m.red[1], s), 2 * (step + 1));
    }
    std::printf("  lanes, %-38s: %d graphs, %ld replays, %ld eager runs; optimizer saw every reduction: %s\n", name, r.plan().graph_count,
                r.counters().replays, r.counters().eager_segment_runs, right ? "yes" : "NO");
    CHECK_MESSAGE(right, name);
}

// ---- a stage that forks onto a stream of its own ------------------------------------------------------

//! c = a + 3 a = 4 step, with 3 a computed on the stage's own side stream.
struct forking_stage {
    ints counter{1}, a{n}, b{n}, c{n};
    cuda::stream side;
    cuda::event forked, joined;
    bool fail_on_side = false; //!< synchronize the side stream while it is captured: forbidden
    stream_handle side_handle = side.get();
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
    void forward(cudaStream_t s) {
        k::fill_from(a.data(), counter.data(), 0, n, s);
        forked.record(s);
        forked.wait_on(side);
        k::scale(b.data(), a.data(), 3, n, side);
        if (fail_on_side) CAPSCOPE_CHECK(cudaStreamSynchronize(side));
        joined.record(side);
        joined.wait_on(s);
        k::add(c.data(), a.data(), b.data(), n, s);
    }
    training_program program() {
        training_program p;
        p.step_begin.push_back(make_stage("advance", -1, {}, stream_fn::of<&forking_stage::advance>(this), {}));
        stage st = make_stage("layer0.forks", 0, {capture_module::mlp}, stream_fn::of<&forking_stage::forward>(this), {});
        st.forks_to = {side_handle};
        p.microbatches = {{st}};
        return p;
    }
};

template <class Config> void check_fork(const char* name) {
    cuda::stream s;
    forking_stage f;
    f.counter.fill_bytes(0, s);
    runner<Config> r(f.program());
    bool right = true;
    for (int step = 1; step <= 5; ++step) {
        poison(f.b, s);
        poison(f.c, s);
        r.step(s);
        right = right && all_equal(get(f.c, s), 4 * step);
    }
    std::printf("  forked stream, %-24s: %ld replays; c = 4 step every step: %s\n", name, r.counters().replays, right ? "yes" : "NO");
    CHECK_MESSAGE(right, name);
}

bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st{};
    CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &st));
    return st != cudaStreamCaptureStatusNone;
}

using lo = impl::lazy_per_layer;
using te = impl::ahead_of_time_per_layer;
using w1 = warmup_steps<1>;

} // namespace

TEST_CASE("lanes: a reduction on a side lane overlaps later layers and is joined before the optimizer, under every impl") {
    check_lanes<config<impl::eager>>("none");
    check_lanes<config<lo, modules<>, w1>>("local, whole layers");
    check_lanes<config<te, modules<>, w1>>("transformer_engine, whole layers");
    check_lanes<config<te, modules<capture::mlp>, w1>>("transformer_engine, mlp");
    check_lanes<config<impl::whole_iteration, no_nan_check, w1>>("full_iteration (lanes inside the graph)");
    // The plan: the reductions are graphs of their own on lane 1, the optimizer waits for it.
    laned_model m;
    runner<config<lo, modules<>, w1>> r(m.program());
    const std::string text = r.plan_text();
    std::printf("%s", text.c_str());
    CHECK(text.find("layer1.reduce  [side lane 1]") != std::string::npos);
    if (capscope::detail::installed_breakage().drop_waits_from.empty()) // broken on purpose, the plan has no such wait: only the data may say so
        CHECK(text.find("optimizer  [waits for layer0.reduce on lane 1]") != std::string::npos);
}

TEST_CASE("a stage that forks onto its own stream: captured with the fork, eager and replayed alike") {
    check_fork<config<impl::eager>>("none");
    check_fork<config<lo, modules<>, w1>>("local");
    check_fork<config<impl::whole_iteration, no_nan_check, w1>>("full_iteration");
}

TEST_CASE("a failure on the forked stream ends the capture on every stream; the policy then runs the segment eagerly") {
    cuda::stream s;
    forking_stage f;
    f.counter.fill_bytes(0, s);
    f.fail_on_side = true;
    {
        runner<config<lo, modules<>, w1>> r(f.program());
        r.step(s); // warmup: eager, synchronizing is allowed
        try {
            r.step(s);
            FAIL("the capture of a synchronizing forked stream succeeded");
        } catch (const capture_failed& e) {
            std::printf("  %s\n", e.what());
            CHECK(e.stage() == "layer0.forks");
            CHECK(std::string(e.what()).find("cudaStreamSynchronize(side) failed") != std::string::npos);
            // Lazy capture fails mid-step: the error says what of the step had run.
            CHECK(e.step_progress().find("this step stopped there: its first 1 of 2 segments had run (through 'advance', forward)") == 0);
        }
        CHECK_FALSE(capturing(s));
        CHECK_FALSE(capturing(f.side));
        CHECK(cudaGetLastError() == cudaSuccess);
    }
    using fall_back = config<lo, modules<>, w1, on_capture_failure<capture_failure::run_eagerly>>;
    runner<fall_back> r(f.program());
    bool right = true;
    for (int step = 0; step < 4; ++step) {
        poison(f.c, s);
        r.step(s);
        const int expected = 4 * (2 + step + 1); // the counter went on from the two steps above
        right = right && all_equal(get(f.c, s), expected);
    }
    CHECK(right);
    CHECK(r.graphs_run_eagerly() == 1);
    CHECK(r.counters().capture_failures == 1);
    CHECK_FALSE(capturing(f.side));
}

namespace {
struct not_a_capture_problem : std::runtime_error {
    using std::runtime_error::runtime_error;
};
//! Fails only while its stream is being captured, in one of three ways.
struct failing_stage {
    enum class how { trainer_exception, out_of_memory } way;
    ints out{n};
    void forward(cudaStream_t s) {
        if (capturing(s)) {
            if (way == how::trainer_exception) throw not_a_capture_problem("the trainer's own check failed");
            void* p = nullptr;
            CAPSCOPE_CHECK(cudaMalloc(&p, std::size_t(1) << 52)); // 4 PiB: out of memory, not a capture rule
        }
        CAPSCOPE_CHECK(cudaMemsetAsync(out.data(), 0, out.bytes(), s));
    }
    training_program program() {
        training_program p;
        p.microbatches = {{make_stage("layer0.fails", 0, {capture_module::mlp}, stream_fn::of<&failing_stage::forward>(this), {})}};
        return p;
    }
};
// run_eagerly: only capture-rule errors may fall back; relaxed, so that cudaMalloc itself is allowed.
using lenient = config<lo, modules<>, w1, on_capture_failure<capture_failure::run_eagerly>, capture_with<capture_mode::relaxed>>;
} // namespace

TEST_CASE("failures that are not capture rules are rethrown as they were, even under run_eagerly") {
    cuda::stream s;
    {
        failing_stage f{failing_stage::how::trainer_exception};
        runner<lenient> r(f.program());
        r.step(s);
        CHECK_THROWS_AS(r.step(s), not_a_capture_problem);
        CHECK(r.graphs_run_eagerly() == 0); // not turned eager for good
        CHECK(r.last_failure().find("capturing graph g0 (layer 0, microbatch 0, forward: layer0.fails) failed in stage 'layer0.fails': "
                                    "the trainer's own check failed") != std::string::npos);
        CHECK_FALSE(capturing(s));
    }
    {
        failing_stage f{failing_stage::how::out_of_memory};
        runner<lenient> r(f.program());
        r.step(s);
        try {
            r.step(s);
            FAIL("no error");
        } catch (const cuda::error& e) {
            std::printf("  rethrown: %s\n", e.what());
            CHECK(e.code() == cudaErrorMemoryAllocation);
            CHECK(e.scope() == "layer0.fails");
        }
        CHECK(r.graphs_run_eagerly() == 0);
        CHECK(r.counters().capture_failures == 1);
        CHECK_FALSE(capturing(s));
        CHECK(cudaGetLastError() == cudaSuccess);
    }
}

TEST_CASE("the legacy default stream is refused at the first step, whatever the failure policy") {
    forking_stage f;
    runner<config<lo, modules<>, w1, on_capture_failure<capture_failure::run_eagerly>>> r(f.program());
    try {
        r.step(nullptr);
        FAIL("the legacy stream was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("legacy default stream (0), which cannot be captured") != std::string::npos);
    }
    CHECK(r.counters().steps == 0);
    CHECK(r.counters().capture_failures == 0);
    runner<config<impl::eager>> eager(f.program());
    f.counter.fill_bytes(0, nullptr);
    eager.step(nullptr); // nothing to capture: any stream
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    CHECK(all_equal(get(f.c, nullptr), 4));
}

//! Step k reads what step k - 1 published (seen[k] = published), then publishes k slowly (2 ms):
//! a step that starts before the last one ended reads an older value.
struct handover_model {
    static constexpr int steps = 8;
    ints published{1}, values{steps}, seen{steps};
    int step = 0;
    void snapshot(cudaStream_t s) { k::scale(seen.data() + step, published.data(), 1, 1, s); }
    void publish(cudaStream_t s) { k::slow_copy(published.data(), values.data() + step++, 1, 2'000'000, s); }
    training_program program() {
        training_program p;
        p.step_begin.push_back(make_stage("snapshot", -1, {}, stream_fn::of<&handover_model::snapshot>(this), {}));
        p.step_begin.back().inputs = {ref(published)};
        p.step_begin.back().outputs = {ref(seen)};
        p.microbatches = {{make_stage("layer0.publish", 0, {capture_module::mlp}, stream_fn::of<&handover_model::publish>(this), {})}};
        p.microbatches[0][0].inputs = {ref(values)};
        p.microbatches[0][0].outputs = {ref(published)};
        return p;
    }
};

TEST_CASE("steps on alternating streams are ordered: each waits for the step before it") {
    cuda::stream a, b;
    handover_model m;
    std::vector<int> values(handover_model::steps);
    for (int i = 0; i < handover_model::steps; ++i) values[std::size_t(i)] = i;
    CAPSCOPE_CHECK(cudaMemcpy(m.values.data(), values.data(), sizeof(int) * values.size(), cudaMemcpyHostToDevice));
    m.published.fill_bytes(0xff, a); // -1 before the first step
    CAPSCOPE_CHECK(cudaStreamSynchronize(a));
    runner<config<impl::eager>> r(m.program());
    for (int i = 0; i < handover_model::steps; ++i) r.step(i % 2 ? b.get() : a.get()); // no synchronization between steps
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    const std::vector<int> seen = get(m.seen, nullptr);
    bool ordered = true;
    for (int i = 0; i < handover_model::steps; ++i) ordered = ordered && seen[std::size_t(i)] == i - 1;
    std::printf("  steps on alternating streams: each read its predecessor's value: %s\n", ordered ? "yes" : "NO");
    CHECK(ordered);
}

TEST_CASE("runners are movable: the graphs move with them") {
    cuda::stream s;
    forking_stage f;
    f.counter.fill_bytes(0, s);
    runner<config<lo, modules<>, w1>> a(f.program());
    a.step(s);
    a.step(s);
    CHECK(a.graphs_alive() == 1);
    runner<config<lo, modules<>, w1>> b(std::move(a));
    CHECK(b.graphs_alive() == 1);
    poison(f.c, s);
    b.step(s);
    CHECK(all_equal(get(f.c, s), 12));
    CHECK(b.counters().replays == 2);
    runner<config<lo, modules<>, w1>> c(f.program());
    c = std::move(b);
    poison(f.c, s);
    c.step(s);
    CHECK(all_equal(get(f.c, s), 16));
}

namespace {
struct scratch_forward {
    ints out{n};
    void forward(cudaStream_t s) {
        void* t = scratch_allocate(out.bytes(), s);
        CAPSCOPE_CHECK(cudaMemsetAsync(t, 7, out.bytes(), s));
        CAPSCOPE_CHECK(cudaMemcpyAsync(out.data(), t, out.bytes(), cudaMemcpyDeviceToDevice, s));
        scratch_free(t, s);
    }
};
} // namespace

TEST_CASE("the bucket runner's graphs take scratch from its arena, not from graph memory") {
    cuda::stream s;
    scratch_forward f;
    inference_program p;
    for (int size : {1, 2}) {
        p.buckets.push_back({make_stage("layer0.scratch", 0, {capture_module::mlp}, stream_fn::of<&scratch_forward::forward>(&f), {})});
        p.bucket_sizes.push_back(size);
    }
    CAPSCOPE_CHECK(cudaDeviceGraphMemTrim(0));
    std::uint64_t zero = 0, high = 0;
    CAPSCOPE_CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
    inference_runner<config<lo, inference::per_block, buckets<1, 2>, w1>> r(std::move(p));
    r.capture_all(s);
    poison(f.out, s);
    r.run(2, s);
    CHECK(all_equal(get(f.out, s), 0x07070707));
    CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &high));
    CHECK(r.counters().captures == 2);
    CHECK(high == 0);
    CHECK(r.scratch().arena_bytes() == f.out.bytes());
}

TEST_CASE("replays make no host allocation: training runner (per layer and whole step) and bucket runner") {
    cuda::stream s;
    gpt::model_config cfg = support::small_model("DEMD", gpt::moe_mode::drop_and_pad, 1.0);
    cfg.microbatches = 2;
    gpt::gpt_model<float> m(cfg, s);
    using facts = model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<1.0>, pad_to_capacity>;
    runner<config<te, modules<>, facts, warmup_steps<2>>> per_layer(m.training_program());
    runner<config<te, modules<capture::attention>, facts, warmup_steps<2>>> partial(m.training_program());
    runner<config<impl::whole_iteration, facts, no_nan_check, warmup_steps<2>>> whole(m.training_program());
    auto measure = [&](auto& r, const char* what) {
        for (int i = 0; i < 3; ++i) r.step(s); // warmup, capture, first replay
        s.synchronize();
        const long before = host_allocations.load();
        for (int i = 0; i < 10; ++i) r.step(s);
        const long made = host_allocations.load() - before;
        s.synchronize();
        std::printf("  %-42s: %ld host allocations over 10 replayed steps (%ld replays)\n", what, made, r.counters().replays);
        CHECK_MESSAGE(made == 0, what);
    };
    measure(per_layer, "transformer_engine, whole layers");
    measure(partial, "transformer_engine, attention (eager islands)");
    measure(whole, "full_iteration");

    gpt::model_config serving = support::small_model("DEM", gpt::moe_mode::drop_and_pad, 2.0);
    serving.batch = 8;
    gpt::inference_model<float> im(serving, s.get());
    using serve = config<lo, inference::per_layer, model<experts<4>, moe_pattern<0, 1, 0>, capacity_factor<2.0>, pad_to_capacity>,
                         warmup_steps<1>, buckets<1, 2, 4, 8>>;
    inference_runner<serve> ir(im.inference_program(serve::engine.batch_buckets.view()));
    ir.capture_all(s.get());
    const bucket_choice c = ir.choose(3);
    ir.run(c, s.get());
    s.synchronize();
    const long before = host_allocations.load();
    for (int i = 0; i < 10; ++i) ir.run(c, s.get());
    const long made = host_allocations.load() - before;
    std::printf("  %-42s: %ld host allocations over 10 replayed forwards\n", "bucket runner, scope layer", made);
    CHECK(made == 0);
}
