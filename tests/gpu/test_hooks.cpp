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

#include <algorithm>
#include <cstdio>
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

// ---- hooks on lanes: a gather into a double buffer, a re-gather, a slow in-place reduction ------

namespace {
constexpr int n = 1 << 16;
constexpr int lane_layers = 4;
constexpr unsigned spin_ns = 100000; // slow enough that work which does not wait reads stale values

//! Four layers whose parameters are gathered by a forward_pre hook on lane 1 from their shard into
//! a double buffer (layer L into full[L % 2]), gathered again by a backward_pre hook before the
//! backward (layer L + 2 overwrote it), and whose gradients a backward hook on lane 2 scales by 5
//! in place, slowly. In step s every shard holds v = s - 1 + 10 (L + 1); the forward keeps
//! act = v, the backward writes grad = 2 v, the reduction makes it 10 v, and the optimizer writes
//! out = grad + act = 11 v and the next step's shards. A second backward hook, on lane 3, reads
//! the layer's parameters late (as a trust ratio would) into seen = v: its context gives them, so
//! the re-gather of layer L - 2 into the same half must wait for it. Any wait the plan leaves out
//! lets a stage read poison or another layer's parameters: out or seen is then wrong.
struct laned_hooks_model {
    ints counter{1};
    ints full[2] = {ints(n), ints(n)};
    std::vector<ints> shard, act, grad, red, out, seen;
    std::vector<tensor_ref> full_refs, grad_refs;
    std::vector<layer_tensors> tensors;
    struct layer_fns {
        laned_hooks_model* m;
        int l;
        void forward(cudaStream_t s) { k::scale(m->act[l].data(), m->full[l % 2].data(), 1, n, s); }
        void backward(cudaStream_t s) { k::scale(m->grad[l].data(), m->full[l % 2].data(), 2, n, s); }
    };
    std::vector<layer_fns> fns;
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
    void optimizer(cudaStream_t s) {
        for (int l = 0; l < lane_layers; ++l) {
            k::add(out[l].data(), grad[l].data(), act[l].data(), n, s);
            k::fill_from(shard[l].data(), counter.data(), 10 * (l + 1), n, s);
        }
    }

    explicit laned_hooks_model(cudaStream_t s) {
        for (int l = 0; l < lane_layers; ++l) {
            for (auto* v : {&shard, &act, &grad, &red, &out, &seen}) v->emplace_back(n);
            fns.push_back({this, l});
        }
        counter.fill_bytes(0, s);
        for (int l = 0; l < lane_layers; ++l) k::fill_from(shard[l].data(), counter.data(), 10 * (l + 1), n, s);
        full_refs.reserve(lane_layers);
        grad_refs.reserve(lane_layers);
        for (int l = 0; l < lane_layers; ++l) {
            full_refs.push_back({"full" + std::to_string(l % 2), full[l % 2].data(), full[l % 2].bytes()});
            grad_refs.push_back({"layer" + std::to_string(l) + ".grad", grad[l].data(), grad[l].bytes()});
            tensors.push_back({{&full_refs.back(), 1}, {&grad_refs.back(), 1}});
        }
    }
    //! `Options`: one_layer_ahead, to prefetch each gather while the layer before it works.
    //! `Trust`: with the trust hook (a pipeline of its own: it orders the reduction before the
    //! optimizer too, so the must-fail run that drops the reduction's waits leaves it out).
    template <bool Trust, class... Options>
    auto hooks() {
        auto gather = hook<hook_phase::forward_pre, capturable, on_lane<1>, Options...>("gather", [this](forward_pre_context& c) {
            k::slow_copy(full[c.layer() % 2].data(), shard[c.layer()].data(), n, spin_ns, c.stream());
        });
        auto regather = hook<hook_phase::backward_pre, capturable, on_lane<1>, Options...>("regather", [this](backward_pre_context& c) {
            k::slow_copy(full[c.layer() % 2].data(), shard[c.layer()].data(), n, spin_ns, c.stream());
        });
        auto reduce = hook<hook_phase::backward, capturable, on_lane<2>>("reduce", [this](backward_context& c) {
            k::slow_copy(red[c.layer()].data(), grad[c.layer()].data(), n, spin_ns, c.stream());
            k::scale(grad[c.layer()].data(), red[c.layer()].data(), 5, n, c.stream());
        });
        // Slower than the re-gather that overwrites this half next: without the wait, it reads
        // layer L - 2's parameters.
        auto trust = hook<hook_phase::backward, capturable, on_lane<3>>("trust", [this](backward_context& c) {
            k::slow_copy(seen[c.layer()].data(), static_cast<const int*>(c.parameters().front().data), n, 4 * spin_ns, c.stream());
        });
        if constexpr (Trust) return hook_pipeline{gather, regather, reduce, trust};
        else return hook_pipeline{gather, regather, reduce};
    }
    training_program program() {
        training_program p;
        stage begin;
        begin.name = "advance";
        begin.forward = stream_fn::of<&laned_hooks_model::advance>(this);
        begin.buffers_declared = true;
        begin.outputs = {{"counter", counter.data(), counter.bytes()}};
        p.step_begin.push_back(begin);
        p.microbatches.emplace_back();
        for (int l = 0; l < lane_layers; ++l) {
            stage st;
            st.name = "layer" + std::to_string(l) + ".work";
            st.layer = l;
            st.captured_by = {capture_module::mlp};
            st.forward = stream_fn::of<&layer_fns::forward>(&fns[std::size_t(l)]);
            st.backward = stream_fn::of<&layer_fns::backward>(&fns[std::size_t(l)]);
            st.buffers_declared = true; // and its layer's parameters (full[l % 2]) and gradients, through with_hooks
            st.outputs = {{"layer" + std::to_string(l) + ".act", act[l].data(), act[l].bytes()}};
            p.microbatches[0].push_back(st);
        }
        stage opt;
        opt.name = "optimizer";
        opt.kind = stage_kind::optimizer;
        opt.forward = stream_fn::of<&laned_hooks_model::optimizer>(this);
        opt.buffers_declared = true; // it touches every layer's parameters and gradients, as a step_end stage
        opt.inputs = {{"counter", counter.data(), counter.bytes()}};
        for (int l = 0; l < lane_layers; ++l) {
            opt.inputs.push_back({"layer" + std::to_string(l) + ".act", act[l].data(), act[l].bytes()});
            opt.outputs.push_back({"layer" + std::to_string(l) + ".shard", shard[l].data(), shard[l].bytes()});
            opt.outputs.push_back({"layer" + std::to_string(l) + ".out", out[l].data(), out[l].bytes()});
        }
        p.step_end.push_back(opt);
        return p;
    }
};

template <class Config, bool Trust, class... HookOptions>
void check_lane_hooks(const char* impl) {
    cuda::stream s;
    laned_hooks_model m(s);
    auto hooks = m.hooks<Trust, HookOptions...>();
    runner<Config> r(with_hooks(m.program(), hooks, m.tensors));
    bool right = true;
    std::string first_wrong;
    for (int step = 1; step <= Config::warmup_steps + 4; ++step) {
        for (auto& b : m.full) support::poison(b.data(), b.bytes(), s);
        for (auto* v : {&m.act, &m.grad, &m.red, &m.out, &m.seen})
            for (auto& b : *v) support::poison(b.data(), b.bytes(), s);
        r.step(s);
        for (int l = 0; l < lane_layers; ++l) {
            const int v = step - 1 + 10 * (l + 1);
            const auto got = support::download(m.out[l].data(), m.out[l].size(), s);
            if (std::count(got.begin(), got.end(), 11 * v) != n && first_wrong.empty())
                first_wrong = "step " + std::to_string(step) + " layer " + std::to_string(l) + ": out[0] = " + std::to_string(got[0]) +
                              ", want " + std::to_string(11 * v);
            const auto seen = support::download(m.seen[l].data(), m.seen[l].size(), s);
            if (Trust && std::count(seen.begin(), seen.end(), v) != n && first_wrong.empty())
                first_wrong = "step " + std::to_string(step) + " layer " + std::to_string(l) + ": the trust hook read parameters " +
                              std::to_string(seen[0]) + ", want " + std::to_string(v);
            right = right && first_wrong.empty();
        }
    }
    std::printf("  lane hooks%s%s, %-20s: %d graphs, %ld replays; every layer%s read its own gathered parameters and "
                "the optimizer the reduced gradients: %s%s\n",
                sizeof...(HookOptions) ? " (prefetched)" : "", Trust ? " (+ trust)" : "", impl, r.plan().graph_count, r.counters().replays,
                Trust ? " and backward hook" : "", right ? "yes" : "NO, ",
                first_wrong.c_str());
    CHECK_MESSAGE(right, impl, ": ", first_wrong);
}
} // namespace

TEST_CASE("hooks on lanes: gathers into a double buffer, re-gathers, a slow in-place reduction, exact under every impl") {
    check_lane_hooks<config<impl::eager>, false>("none");
    check_lane_hooks<config<impl::lazy_per_layer, modules<>, warmup_steps<1>>, false>("local");
    check_lane_hooks<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, false>("transformer_engine");
    check_lane_hooks<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>, false>("full_iteration");
    cuda::stream s;
    laned_hooks_model m(s);
    auto hooks = m.hooks<false>();
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>> r(with_hooks(m.program(), hooks, m.tensors));
    std::printf("%s", r.plan_text().c_str());
}

// Named apart from the case above (doctest's -tc splits at commas): the must-fail builds run it alone.
TEST_CASE("prefetched hooks on lanes: layer L + 1's gather beside layer L's work, one layer ahead, exact under every impl") {
    check_lane_hooks<config<impl::eager>, false, one_layer_ahead>("none");
    check_lane_hooks<config<impl::lazy_per_layer, modules<>, warmup_steps<1>>, false, one_layer_ahead>("local");
    check_lane_hooks<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, false, one_layer_ahead>("transformer_engine");
    check_lane_hooks<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>, false, one_layer_ahead>("full_iteration");
}

// A backward hook reads its layer's parameters through its context (a trust ratio): the re-gather
// into the same half of the double buffer waits for it (issue 46, finding 1).
TEST_CASE("trust hooks on lanes: a backward hook that reads its parameters, before the re-gather that overwrites them, under every impl") {
    check_lane_hooks<config<impl::eager>, true>("none");
    check_lane_hooks<config<impl::lazy_per_layer, modules<>, warmup_steps<1>>, true>("local");
    check_lane_hooks<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, true>("transformer_engine");
    check_lane_hooks<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>, true>("full_iteration");
}

TEST_CASE("prefetched trust hooks on lanes: the same, with gathers one layer ahead, under every impl") {
    check_lane_hooks<config<impl::eager>, true, one_layer_ahead>("none");
    check_lane_hooks<config<impl::lazy_per_layer, modules<>, warmup_steps<1>>, true, one_layer_ahead>("local");
    check_lane_hooks<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>, true, one_layer_ahead>("transformer_engine");
    check_lane_hooks<config<impl::whole_iteration, no_nan_check, warmup_steps<1>>, true, one_layer_ahead>("full_iteration");
}
