// The capture doctor (capscope/run/capture_doctor.hpp): each call a graph cannot hold, injected
// into a captured stage, is named before the first capture with the stage, the call and the
// stream (plan rule P20); under capture_failure::run_eagerly that graph stays eager instead; a
// trainer whose own error check calls exit() never gets there; the same stages without the
// offending call (and with a fork joined back) capture and replay bitwise equal to eager.

#include "breakage.hpp"
#include "engine_kernels.hpp"
#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;
using ints = cuda::device_buffer<int>;

namespace {

constexpr int n = 1024;

enum class offence {
    none,
    joined_fork,     // not an offence: forked onto another stream and joined back
    foreign_record, // left to the capture: waits for an event recorded on a stream of a library's own (NCCL, eagerly)
    legacy_stream,
    per_thread_stream,
    global_stream,
    sync_copy,
    sync_memset,
    allocation,
    stream_sync,
    device_sync,
    event_query,
    unjoined_fork,
};

//! Two layers: layer L's forward writes act[L] = 2 (x + L), its backward grad[L] = 3 act[L]; the
//! optimizer adds the gradients into `out`. Layer 0's forward also does `what`, on the side.
struct doctor_model {
    ints counter{1}, x{n}, tmp{n}, out{n};
    ints act[2] = {ints(n), ints(n)}, grad[2] = {ints(n), ints(n)};
    cuda::stream global; //!< a stream of the trainer's own, as a global
    cuda::event forked, joined;
    offence what;
    int host_value = 0;
    struct layer_fns {
        doctor_model* m;
        int l;
        void forward(cudaStream_t s) {
            k::fill_from(m->x.data(), m->counter.data(), 10 * l, n, s);
            k::scale(m->act[l].data(), m->x.data(), 2, n, s);
            if (l == 0) m->misbehave(s);
        }
        void backward(cudaStream_t s) { k::scale(m->grad[l].data(), m->act[l].data(), 3, n, s); }
    };
    layer_fns fns[2] = {{this, 0}, {this, 1}};

    explicit doctor_model(offence o, cudaStream_t s) : what(o) {
        counter.fill_bytes(0, s);
        out.fill_bytes(0, s);
        tmp.fill_bytes(0, s);
    }
    void misbehave(cudaStream_t s) {
        switch (what) {
        case offence::none: return;
        case offence::joined_fork:
            CAPSCOPE_CHECK(cudaEventRecord(forked.get(), s));
            CAPSCOPE_CHECK(cudaStreamWaitEvent(global, forked.get(), 0));
            k::scale(tmp.data(), x.data(), 1, n, global);
            CAPSCOPE_CHECK(cudaEventRecord(joined.get(), global));
            CAPSCOPE_CHECK(cudaStreamWaitEvent(s, joined.get(), 0));
            return;
        case offence::foreign_record:
            CAPSCOPE_CHECK(cudaEventRecord(joined.get(), global));
            CAPSCOPE_CHECK(cudaStreamWaitEvent(s, joined.get(), 0));
            return;
        case offence::legacy_stream: return k::scale(tmp.data(), x.data(), 1, n, nullptr);
        case offence::per_thread_stream: return k::scale(tmp.data(), x.data(), 1, n, cudaStreamPerThread);
        case offence::global_stream: return k::scale(tmp.data(), x.data(), 1, n, global);
        case offence::sync_copy: CAPSCOPE_CHECK(cudaMemcpy(&host_value, x.data(), sizeof(int), cudaMemcpyDeviceToHost)); return;
        case offence::sync_memset: CAPSCOPE_CHECK(cudaMemset(tmp.data(), 0, sizeof(int))); return;
        case offence::allocation: {
            void* p = nullptr;
            CAPSCOPE_CHECK(cudaMalloc(&p, 256));
            CAPSCOPE_CHECK(cudaFree(p));
            return;
        }
        case offence::stream_sync: CAPSCOPE_CHECK(cudaStreamSynchronize(s)); return;
        case offence::device_sync: CAPSCOPE_CHECK(cudaDeviceSynchronize()); return;
        case offence::event_query:
            CAPSCOPE_CHECK(cudaEventRecord(forked.get(), s));
            (void)cudaEventQuery(forked.get()); // cudaErrorNotReady is an answer
            return;
        case offence::unjoined_fork:
            CAPSCOPE_CHECK(cudaEventRecord(forked.get(), s));
            CAPSCOPE_CHECK(cudaStreamWaitEvent(global, forked.get(), 0));
            k::scale(tmp.data(), x.data(), 1, n, global);
            return;
        }
    }
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
    void optimizer(cudaStream_t s) {
        for (int l = 0; l < 2; ++l) k::add(out.data(), out.data(), grad[l].data(), n, s);
    }
    training_program program() {
        training_program p;
        stage begin;
        begin.name = "advance";
        begin.forward = stream_fn::of<&doctor_model::advance>(this);
        p.step_begin.push_back(begin);
        p.microbatches.emplace_back();
        for (int l = 0; l < 2; ++l) {
            stage st;
            st.name = "layer" + std::to_string(l) + ".work";
            st.layer = l;
            st.forward = stream_fn::of<&layer_fns::forward>(&fns[l]);
            st.backward = stream_fn::of<&layer_fns::backward>(&fns[l]);
            p.microbatches[0].push_back(st);
        }
        stage opt;
        opt.name = "optimizer";
        opt.kind = stage_kind::optimizer;
        opt.forward = stream_fn::of<&doctor_model::optimizer>(this);
        p.step_end.push_back(opt);
        return p;
    }
};

constexpr int steps = 5;

//! What `steps` steps leave in `out` under `Config`, with no offence.
template <class Config>
std::vector<int> clean_run(offence o) {
    cuda::stream s;
    doctor_model m(o, s);
    runner<Config> r(m.program());
    for (int i = 0; i < steps; ++i) r.step(s);
    if constexpr (Config::impl != graph_impl::eager) {
        CHECK(r.counters().replays > 0);
        CHECK_MESSAGE(r.counters().doctor_calls_watched > 0, "the doctor watched no call");
    }
    return support::download(m.out.data(), n, s);
}

//! The text of what the runner throws at the last warmup step with offence `o`, or "(nothing)".
template <class Config>
std::string refusal(offence o) {
    cuda::stream s;
    doctor_model m(o, s);
    runner<Config> r(m.program());
    try {
        for (int i = 0; i < steps; ++i) r.step(s);
    } catch (const plan_error& e) {
        CHECK(r.counters().captures == 0); // said before any capture
        CHECK(e.rule() == "P20");
        CHECK(e.stage() == "layer0.work");
        // Still in its last warmup step: the next step is watched and refused again, not captured.
        CHECK_THROWS_AS(r.step(s), plan_error);
        CHECK(r.counters().captures == 0);
        return e.what();
    }
    return "(nothing)";
}

using te = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>;

} // namespace

TEST_CASE("the capture doctor names each call a graph cannot hold, in its stage, before the first capture") {
    struct expectation {
        offence o;
        const char* call;
        const char* words;
    };
    const expectation cases[] = {
        {offence::legacy_stream, "calls cudaLaunchKernel", "launches on the legacy default stream, which cannot be captured"},
        {offence::per_thread_stream, "calls cudaLaunchKernel", "enqueues on the per-thread default stream"},
        {offence::global_stream, "calls cudaLaunchKernel", "a stream it was not given and did not fork from it: captured, this work would run once"},
        {offence::sync_copy, "calls cudaMemcpy", "makes a synchronous copy"},
        {offence::sync_memset, "calls cudaMemset", "sets memory synchronously"},
        {offence::allocation, "calls cudaMalloc", "allocates or frees memory"},
        {offence::stream_sync, "calls cudaStreamSynchronize", "synchronizes a stream with the host"},
        {offence::device_sync, "calls cudaDeviceSynchronize", "synchronizes the device with the host"},
        {offence::event_query, "calls cudaEventQuery", "queries work in flight"},
        {offence::unjoined_fork, "stage 'layer0.work' leaves work it forked onto stream", "unjoined when it returns"},
    };
    for (const expectation& e : cases) {
        const std::string text = refusal<te>(e.o);
        std::printf("  %s\n", text.substr(0, 300).c_str());
        CHECK_MESSAGE(text.find("capscope plan rule P20: the capture doctor watched the last warmup step") == 0, text);
        CHECK_MESSAGE(text.find("stage 'layer0.work'") != std::string::npos, text);
        CHECK_MESSAGE(text.find(e.call) != std::string::npos, text);
        CHECK_MESSAGE(text.find(e.words) != std::string::npos, text);
        CHECK_MESSAGE(text.find("layer1.work") == std::string::npos, text); // the other stage did nothing wrong
    }
    // Under the other capturing impls too.
    CHECK(refusal<config<impl::lazy_per_layer, modules<>, warmup_steps<2>>>(offence::global_stream).find("P20") != std::string::npos);
    CHECK(refusal<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>>(offence::legacy_stream).find("P20") != std::string::npos);
    // An allocation is no offence where the capture mode allows it.
    CHECK(refusal<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>, capture_with<capture_mode::relaxed>>>(offence::allocation) ==
          "(nothing)");
    // Switched off, it says nothing (and the capture itself then fails).
    cuda::stream s;
    doctor_model m(offence::global_stream, s);
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>, capture_doctor_off>> r(m.program());
    r.step(s);
    r.step(s);
    CHECK(r.counters().doctor_calls_watched == 0);
}

TEST_CASE("under capture_failure::run_eagerly, a graph whose stage the doctor refused stays eager, and the steps stay exact") {
    const std::vector<int> eager = clean_run<config<impl::eager>>(offence::none);
    cuda::stream s;
    doctor_model m(offence::global_stream, s);
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>, on_capture_failure<capture_failure::run_eagerly>>> r(m.program());
    for (int i = 0; i < steps; ++i) r.step(s);
    CHECK(r.graphs_run_eagerly() == 1); // layer 0's forward graph: the offence is in its forward only
    CHECK(r.counters().replays > 0);    // layer 1's graphs replay
    CHECK(support::download(m.out.data(), n, s) == eager);
    std::printf("  run_eagerly: %d graphs left eager, %ld replays, out exact\n", r.graphs_run_eagerly(), r.counters().replays);
}

TEST_CASE("the same stages without the offending call, and with a fork joined back, capture and replay bitwise equal to eager") {
    for (offence o : {offence::none, offence::joined_fork}) {
        const std::vector<int> eager = clean_run<config<impl::eager>>(o);
        CHECK(clean_run<config<impl::lazy_per_layer, modules<>, warmup_steps<2>>>(o) == eager);
        CHECK(clean_run<te>(o) == eager);
        CHECK(clean_run<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>>(o) == eager);
        std::printf("  %s: local, transformer_engine and full_iteration bitwise equal to eager after %d steps (out[0] = %d)\n",
                    o == offence::none ? "clean stages" : "a fork joined back", steps, eager[0]);
    }
    // A wait for an event recorded on a stream of a library's own is left to the capture (NCCL
    // records such events eagerly and takes another path while capturing); in a trainer's own
    // code the capture then refuses it, loudly.
    {
        cuda::stream s;
        doctor_model m(offence::foreign_record, s);
        runner<te> r(m.program());
        r.step(s);
        r.step(s);
        CHECK(r.counters().doctor_calls_watched > 0);
        CHECK_THROWS_AS(r.step(s), capture_failed);
    }
    // Steps on the per-thread default stream, which can be captured: the stream each stage is given.
    doctor_model m(offence::none, cudaStreamPerThread);
    runner<te> r(m.program());
    for (int i = 0; i < steps; ++i) r.step(cudaStreamPerThread);
    CHECK(r.counters().doctor_calls_watched > 0);
    CHECK(support::download(m.out.data(), n, cudaStreamPerThread) == clean_run<config<impl::eager>>(offence::none));
}

namespace {
//! A trainer of its own: a kernel launched on the legacy stream (no stream argument), and an error
//! check that ends the process, as C trainers do.
struct exiting_trainer {
    ints counter{1}, x{n};
    void forward(cudaStream_t s) {
        k::fill_from(x.data(), counter.data(), 0, n, s);
        k::scale_unchecked(x.data(), x.data(), 2, n, nullptr); // the legacy stream
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
            std::fprintf(stderr, "trainer: CUDA error %s, exiting\n", cudaGetErrorString(e));
            std::exit(3);
        }
    }
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
};

template <class Config>
void run_exiting_trainer(cudaStream_t s) {
    exiting_trainer t;
    t.counter.fill_bytes(0, s);
    training_program p;
    stage begin;
    begin.name = "advance";
    begin.forward = stream_fn::of<&exiting_trainer::advance>(&t);
    p.step_begin.push_back(begin);
    stage st;
    st.name = "layer0.block";
    st.layer = 0;
    st.forward = stream_fn::of<&exiting_trainer::forward>(&t);
    p.microbatches.push_back({st});
    runner<Config> r(std::move(p));
    try {
        for (int i = 0; i < steps; ++i) r.step(s);
        FAIL("the doctor let a legacy-stream launch through to a capture");
    } catch (const plan_error& e) {
        std::printf("  the trainer's check never ran under capture: %.160s...\n", e.what());
        CHECK(std::string(e.what()).find("stage 'layer0.block' calls cudaLaunchKernel") != std::string::npos);
    }
}
} // namespace

TEST_CASE("a trainer whose error check exits: the doctor speaks before any capture, so the process lives") {
    // A blocking stream, as such a trainer's: a legacy-stream launch while it captures is an error.
    cudaStream_t blocking = nullptr;
    CAPSCOPE_CHECK(cudaStreamCreate(&blocking));
    if (breakage::broken("no_doctor")) // broken on purpose: without the doctor the trainer's exit(3) ends the test
        run_exiting_trainer<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>, capture_doctor_off>>(blocking);
    else
        run_exiting_trainer<te>(blocking);
    CAPSCOPE_CHECK(cudaStreamDestroy(blocking));
}
