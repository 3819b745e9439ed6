// Hooks on the GPU (hooks/with_hooks.hpp): every stage and every capturable hook appends its id
// to a log in device memory. Under each impl, eager warmup steps and captured replays must write
// the same log as an eager step, in the order the hooks' phases promise; a replay that did not
// run (or ran a hook in the wrong graph or phase) writes a different log. Boundary hooks run on
// the host around every replay.

#include "engine_kernels.hpp"
#include "support.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

constexpr int capacity = 512;
using ints = cuda::device_buffer<int>;

//! Two layers of two stages (attention, mlp), two microbatches; ids: stage 100 * layer + 10 * stage
//! + 1 forward / 2 backward, plus 1000 * (microbatch + 1).
struct logged_model {
    ints log{capacity}, length{1};
    struct stage_fns {
        logged_model* m;
        int id;
        void forward(cudaStream_t s) { k::append(m->log.data(), m->length.data(), capacity, id + 1, s); }
        void backward(cudaStream_t s) { k::append(m->log.data(), m->length.data(), capacity, id + 2, s); }
    };
    std::vector<stage_fns> fns;

    training_program program() {
        fns.reserve(8);
        training_program p;
        for (int mb = 0; mb < 2; ++mb) {
            std::vector<stage> list;
            for (int layer = 0; layer < 2; ++layer)
                for (int which = 0; which < 2; ++which) {
                    fns.push_back({this, 1000 * (mb + 1) + 100 * layer + 10 * which});
                    stage st;
                    st.name = "layer" + std::to_string(layer) + (which == 0 ? ".attention" : ".mlp");
                    st.layer = layer;
                    st.captured_by = which == 0 ? region_set{capture_module::attention} : region_set{capture_module::mlp};
                    st.forward = stream_fn::of<&stage_fns::forward>(&fns.back());
                    st.backward = stream_fn::of<&stage_fns::backward>(&fns.back());
                    st.buffers_declared = true;
                    list.push_back(st);
                }
            p.microbatches.push_back(std::move(list));
        }
        return p;
    }
    std::vector<int> read(cudaStream_t s) {
        auto n = support::download(length.data(), 1, s).front();
        REQUIRE(n <= capacity);
        auto all = support::download(log.data(), capacity, s);
        return {all.begin(), all.begin() + n};
    }
    void clear(cudaStream_t s) {
        length.fill_bytes(0, s);
        log.fill_bytes(0xff, s);
    }
};

//! Hook ids: 7000 + 100 * layer + 10 * microbatch + the hook's number.
template <hook_phase P>
auto logging_hook(logged_model& m, int number) {
    return [&m, number](hook_context<P>& c) {
        k::append(m.log.data(), m.length.data(), capacity, 7000 + 100 * c.layer() + 10 * c.microbatch() + number, c.stream());
    };
}

auto capturable_hooks(logged_model& m) {
    return hook_pipeline{
        hook<hook_phase::forward_pre, capturable>("gather", logging_hook<hook_phase::forward_pre>(m, 1)),
        hook<hook_phase::forward, capturable>("after", logging_hook<hook_phase::forward>(m, 2)),
        hook<hook_phase::backward_pre, capturable>("regather", logging_hook<hook_phase::backward_pre>(m, 3)),
        hook<hook_phase::backward, capturable>("reduce", logging_hook<hook_phase::backward>(m, 4)),
        hook<hook_phase::backward, capturable, of_region<capture::mlp>>("reduce mlp", logging_hook<hook_phase::backward>(m, 5)),
    };
}

//! The log one step writes, from the program and the hooks' promise alone.
std::vector<int> promised_log() {
    std::vector<int> out;
    for (int mb = 0; mb < 2; ++mb) {
        const int base = 1000 * (mb + 1);
        auto hook_id = [&](int layer, int number) { return 7000 + 100 * layer + 10 * mb + number; };
        for (int layer = 0; layer < 2; ++layer) {
            out.push_back(hook_id(layer, 1));              // forward_pre
            out.push_back(base + 100 * layer + 0 + 1);     // attention forward
            out.push_back(base + 100 * layer + 10 + 1);    // mlp forward
            out.push_back(hook_id(layer, 2));              // forward
        }
        for (int layer = 1; layer >= 0; --layer) {
            out.push_back(hook_id(layer, 3));              // backward_pre
            out.push_back(base + 100 * layer + 10 + 2);    // mlp backward
            out.push_back(hook_id(layer, 5));              // the mlp region's backward hook
            out.push_back(base + 100 * layer + 0 + 2);     // attention backward
            out.push_back(hook_id(layer, 4));              // backward, after the layer's
        }
    }
    return out;
}

template <class Config>
void check_hook_order(const char* impl) {
    cuda::stream s;
    logged_model m;
    auto hooks = capturable_hooks(m);
    static_assert(hooks_fit<Config, decltype(hooks)>);
    const layer_tensors tensors[2] = {};
    runner<Config> r(with_hooks(m.program(), hooks, tensors));
    const auto want = promised_log();
    for (int step = 0; step < Config::warmup_steps + 3; ++step) {
        m.clear(s);
        r.step(s);
        CHECK_MESSAGE(m.read(s) == want, impl, ", step ", step);
    }
    if constexpr (Config::impl != graph_impl::eager) CHECK_MESSAGE(r.counters().replays > 0, impl);
    r.reset(); // after reset: eager warmup again, then captured, in the same order
    for (int step = 0; step < Config::warmup_steps + 2; ++step) {
        m.clear(s);
        r.step(s);
        CHECK_MESSAGE(m.read(s) == want, impl, ", after reset, step ", step);
    }
}

} // namespace

TEST_CASE("capturable hooks run in their phase and order, eager, warmup, captured and after reset, under every impl") {
    check_hook_order<config<impl::eager>>("none");
    check_hook_order<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, warmup_steps<1>>>("local");
    check_hook_order<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine");
    check_hook_order<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration");
}

TEST_CASE("a boundary hook runs on the host around every replay of its layer's graph") {
    cuda::stream s;
    logged_model m;
    int host_calls = 0;
    hook_pipeline hooks{
        hook<hook_phase::forward, boundary, synchronizes_with_host>("host check", [&](forward_context& c) {
            CAPSCOPE_CHECK(cudaStreamSynchronize(c.stream())); // host work: legal outside a graph only
            ++host_calls;
        }),
        hook<hook_phase::backward, capturable>("reduce", logging_hook<hook_phase::backward>(m, 4)),
    };
    using cfg = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>;
    static_assert(hooks_fit<cfg, decltype(hooks)>);
    const layer_tensors tensors[2] = {};
    runner<cfg> r(with_hooks(m.program(), hooks, tensors));
    for (int step = 0; step < 4; ++step) {
        m.clear(s);
        r.step(s);
        CHECK(host_calls == 4 * (step + 1)); // 2 layers x 2 microbatches, every step
    }
    CHECK(r.counters().replays > 0);
}

namespace {
template <class Config>
void check_capture_time(const char* impl, int per_capture_round) {
    cuda::stream s;
    logged_model m;
    int at_capture = 0;
    hook_pipeline hooks{
        hook<hook_phase::forward_pre, capture_time>("register", [&](forward_pre_context&) { ++at_capture; }),
        hook<hook_phase::backward, capturable>("reduce", logging_hook<hook_phase::backward>(m, 4)),
    };
    const layer_tensors tensors[2] = {};
    runner<Config> r(with_hooks(m.program(), hooks, tensors));
    for (int step = 0; step < Config::warmup_steps + 3; ++step) r.step(s);
    CHECK_MESSAGE(at_capture == per_capture_round, impl); // once per capture of each hooked segment, never eagerly or replayed
    r.reset();
    for (int step = 0; step < Config::warmup_steps + 2; ++step) r.step(s);
    CHECK_MESSAGE(at_capture == 2 * per_capture_round, impl, ": again once per capture after reset()");
}
} // namespace

TEST_CASE("a capture-time hook runs once per capture of its segment: never eagerly, never on a replay") {
    // 2 layers x 2 microbatches: four hooked forward segments (per-layer impls), all in one graph
    // (whole_iteration), none captured (eager).
    check_capture_time<config<impl::eager>>("none", 0);
    check_capture_time<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, warmup_steps<1>>>("local", 4);
    check_capture_time<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>>("transformer_engine", 4);
    check_capture_time<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>>("full_iteration", 4);
}
