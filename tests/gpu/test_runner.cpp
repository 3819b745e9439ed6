// The runner on the GPU: every impl and module set trains bit for bit like eager execution
// (losses, every parameter, every gradient, both Adam moments), with 2 microbatches and a
// learning-rate schedule, in fp32 and bf16; the counters say what happened; capture faults are
// reported or fall back to eager; reset() returns to eager with identical results; replays
// allocate nothing; dropout draws new masks on every replay. (The runner's scratch memory:
// test_scratch.cpp.)

#include "support.hpp"

#include <gpt/model.hpp>
#include <gpt/schemas.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>

using namespace capscope;

namespace {

constexpr int steps = 6;
constexpr int microbatches = 2;

//! A small dense / MoE / Mamba / dense model with 2 microbatches.
gpt::model_config mixed(gpt::moe_mode mode) {
    gpt::model_config c = support::small_model("DEMD", mode, 1.0);
    c.microbatches = microbatches;
    return c;
}

//! A learning-rate schedule: a captured optimizer step must follow it.
gpt::adamw_config optimizer_at(int step) {
    gpt::adamw_config o;
    o.lr = 2e-3f * std::cos(0.2f * float(step));
    return o;
}

template <class T> void feed(gpt::gpt_model<T>& m, int step, cudaStream_t s) {
    for (int mb = 0; mb < m.config().microbatches; ++mb) {
        const auto b = support::random_batch(m.config().batch, m.config().seq_len, m.config().vocab, 1000 + 10 * std::uint64_t(step) + mb);
        m.set_batch(mb, b.tokens, b.labels, s);
    }
    m.set_optimizer(optimizer_at(step), s);
}

template <class T> struct state {
    std::vector<float> losses, grads, masters, m, v;
    std::vector<T> values;
};

template <class T> void record_losses(const gpt::gpt_model<T>& m, state<T>& st, cudaStream_t s) {
    for (int mb = 0; mb < m.config().microbatches; ++mb) st.losses.push_back(m.microbatch_loss(s, mb));
}
template <class T> void record_final(const gpt::gpt_model<T>& m, state<T>& st, cudaStream_t s) {
    const auto& p = m.parameters();
    st.grads = support::download(p.grads(), p.total(), s);
    st.masters = support::download(p.masters(), p.total(), s);
    st.m = support::download(p.first_moment(), p.total(), s);
    st.v = support::download(p.second_moment(), p.total(), s);
    st.values = support::download(p.values(), p.total(), s);
}

//! Steps [first, last) through a runner, recording each step's microbatch losses.
template <class T, class Runner> void run_steps(Runner& r, gpt::gpt_model<T>& m, state<T>& st, int first, int last, cudaStream_t s) {
    for (int step = first; step < last; ++step) {
        feed(m, step, s);
        r.step(s);
        record_losses(m, st, s);
    }
}

//! The reference: the model's own calls, in the order a training step makes them.
template <class T> state<T> eager_reference(const gpt::model_config& cfg, int n = steps) {
    capscope::cuda::stream s;
    gpt::gpt_model<T> m(cfg, s);
    state<T> st;
    for (int step = 0; step < n; ++step) {
        feed(m, step, s);
        m.zero_grad(s);
        for (int mb = 0; mb < cfg.microbatches; ++mb) {
            m.forward(s, mb);
            m.backward(s, mb);
        }
        m.optimizer_step(s);
        record_losses(m, st, s);
    }
    record_final(m, st, s);
    return st;
}

template <class T> bool identical(const state<T>& a, const state<T>& b) {
    return support::same_bits(a.losses, b.losses) && support::same_bits(a.grads, b.grads) && support::same_bits(a.masters, b.masters) &&
           support::same_bits(a.m, b.m) && support::same_bits(a.v, b.v) && support::same_bits(a.values, b.values);
}
template <class T> void check_identical(const state<T>& got, const state<T>& want) {
    CHECK(support::same_bits(got.losses, want.losses));
    CHECK(support::same_bits(got.grads, want.grads));
    CHECK(support::same_bits(got.masters, want.masters));
    CHECK(support::same_bits(got.m, want.m));
    CHECK(support::same_bits(got.v, want.v));
    CHECK(support::same_bits(got.values, want.values));
}

using dp_facts = model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<1.0>, pad_to_capacity>;
using dropless_facts = model<experts<4>, moe_pattern<0, 1, 0, 0>>;
using w2 = warmup_steps<2>;

template <class Config, gpt::moe_mode Mode> struct matrix_case {
    using config = Config;
    static constexpr gpt::moe_mode mode = Mode;
};
constexpr auto dp = gpt::moe_mode::drop_and_pad;
constexpr auto dl = gpt::moe_mode::dropless;
using lo = impl::lazy_per_layer;
using te = impl::ahead_of_time_per_layer;
namespace c = capture;

template <class... Cases> struct case_list {};
using all_cases = case_list<
    matrix_case<config<impl::eager, dp_facts>, dp>,
    matrix_case<config<impl::eager, dropless_facts>, dl>,
    // local: lazily captured per layer
    matrix_case<config<lo, modules<>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::attention>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::attention, c::mlp>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::attention, c::moe_router, c::moe_preprocess>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::moe>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::mamba>, dp_facts, w2>, dp>,
    matrix_case<config<lo, modules<c::attention, c::mlp>, dropless_facts, w2>, dl>,
    // transformer_engine: captured ahead of time, in schedule order
    matrix_case<config<te, modules<>, dp_facts, w2>, dp>,
    matrix_case<config<te, modules<c::attention>, dp_facts, w2>, dp>,
    matrix_case<config<te, modules<c::attention, c::mlp>, dp_facts, w2>, dp>,
    matrix_case<config<te, modules<c::attention, c::moe_router, c::moe_preprocess>, dp_facts, w2>, dp>,
    matrix_case<config<te, modules<c::attention, c::moe_router>, dropless_facts, w2>, dl>,
    matrix_case<config<te, modules<c::moe>, dp_facts, w2>, dp>,
    matrix_case<config<te, modules<c::mamba>, dp_facts, w2>, dp>,
    // full_iteration: the whole step, both microbatches and the optimizer, as one graph
    matrix_case<config<impl::whole_iteration, dp_facts, no_nan_check, w2>, dp>>;

template <class Config, class T> state<T> run_with_runner(const gpt::model_config& cfg, runner_counters& counters, std::string& plan_line) {
    capscope::cuda::stream s;
    gpt::gpt_model<T> m(cfg, s);
    using schemas = std::conditional_t<Config::normalized.drop_and_pad(), gpt::schemas::drop_and_pad_model, gpt::schemas::dropless_model>;
    runner<Config, schemas> r(m.training_program());
    state<T> st;
    run_steps(r, m, st, 0, steps, s);
    record_final(m, st, s);
    counters = r.counters();
    const auto& plan = r.plan();
    // What the counters must say, from the plan alone.
    const int warm = Config::warmup_steps < steps ? Config::warmup_steps : steps;
    const bool graphs = Config::impl != graph_impl::eager;
    CHECK(counters.steps == steps);
    CHECK(counters.captures == plan.graph_count);
    CHECK(counters.instantiations == plan.graph_count);
    CHECK(counters.capture_failures == 0);
    CHECK(counters.replays == (graphs ? long(steps - warm) * plan.graph_launches_per_step() : 0));
    CHECK(counters.eager_segment_runs == (graphs ? long(warm) * long(plan.segments.size()) + long(steps - warm) * plan.eager_islands_per_step()
                                                 : long(steps) * long(plan.segments.size())));
    CHECK(r.graphs_alive() == plan.graph_count);
    plan_line = std::to_string(plan.graph_count) + " graphs, " + std::to_string(plan.graph_launches_per_step()) + " launches + " +
                std::to_string(plan.eager_islands_per_step()) + " eager islands per step";
    return st;
}

template <class T, class Case> void run_case(const state<T>& reference_dp, const state<T>& reference_dl) {
    using Config = typename Case::config;
    runner_counters counters;
    std::string plan_line;
    const auto got = run_with_runner<Config, T>(mixed(Case::mode), counters, plan_line);
    const auto& want = Case::mode == dp ? reference_dp : reference_dl;
    const std::string modules = is_per_layer(Config::impl)
                                    ? (Config::modules.empty() ? std::string("<whole layer>") : "{" + capscope::detail::module_list(Config::modules) + "}")
                                    : std::string("-");
    std::printf("  runner %s %-18s %-32s %-12s: %s; replays %ld, eager runs %ld; identical bits: %s\n", support::precision_name<T>,
                std::string(megatron_name(Config::impl)).c_str(), modules.c_str(), Case::mode == dp ? "drop-and-pad" : "dropless",
                plan_line.c_str(), counters.replays, counters.eager_segment_runs, identical(got, want) ? "yes" : "NO");
    check_identical(got, want);
}

template <class T, class... Cases> void run_all(case_list<Cases...>) {
    const auto reference_dp = eager_reference<T>(mixed(dp));
    const auto reference_dl = eager_reference<T>(mixed(dl));
    REQUIRE(reference_dp.losses.back() != reference_dp.losses.front()); // the steps learn something
    (run_case<T, Cases>(reference_dp, reference_dl), ...);
}

} // namespace

TEST_CASE_TEMPLATE("every impl and module set trains bit for bit like eager (2 microbatches, LR schedule)", T, float, __nv_bfloat16, __half) {
    run_all<T>(all_cases{});
}

TEST_CASE("the plan rejects a host-synchronizing stage before any capture; the schemas reject a mismatched model") {
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(mixed(dl), s);
    using captures_preprocess = config<te, modules<c::attention, c::moe_router, c::moe_preprocess>, dropless_facts>;
    try {
        runner<captures_preprocess> r(m.training_program());
        FAIL("a runner accepted a host-synchronizing stage in a graph");
    } catch (const plan_error& e) {
        std::printf("  plan error: %s\n", e.what());
        CHECK(e.rule() == "P1");
        CHECK(e.stage() == "layer1.moe_preprocess");
        CHECK(std::string(e.what()).find("fix: drop moe_preprocess from the modules (capture moe_router only)") != std::string::npos);
    }
    try {
        runner<config<te, modules<c::attention, c::moe_router>, dropless_facts>, gpt::schemas::drop_and_pad_model> r(m.training_program());
        FAIL("a dropless model matched drop-and-pad schemas");
    } catch (const schema_mismatch& e) {
        CHECK(std::string(e.what()).find("layer 1 of the model matches none of the runner's layer schemas") != std::string::npos);
    }
}

namespace {
//! The dropless model's program with the tags that keep its MoE preprocess out of graphs
//! removed: the plan believes it, and the capture fails at run time.
capscope::training_program untagged(const gpt::gpt_model<float>& m) {
    auto p = m.training_program();
    for (auto& list : p.microbatches)
        for (auto& st : list) st.synchronizes_with_host = st.shapes_depend_on_data = false;
    return p;
}
// The capture doctor would name the stage at the last warmup step (below): off here, to test the
// capture's own failure path, as a run where CUPTI is taken (a profiler) meets it.
using captures_untagged = config<te, modules<c::attention, c::moe_router, c::moe_preprocess>, dropless_facts, w2, capture_doctor_off>;
} // namespace

TEST_CASE("the capture doctor names the untagged host-synchronizing stage at the last warmup step, before any capture") {
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(mixed(dl), s);
    runner<config<te, modules<c::attention, c::moe_router, c::moe_preprocess>, dropless_facts, w2>> r(untagged(m));
    state<float> st;
    try {
        run_steps(r, m, st, 0, 2, s);
        FAIL("the doctor let a host-synchronizing stage through to a capture");
    } catch (const plan_error& e) {
        std::printf("  capture doctor: %.300s\n", e.what());
        CHECK(e.rule() == "P20");
        CHECK(e.stage() == "layer1.moe_preprocess");
        CHECK(r.counters().captures == 0);
    }
}

TEST_CASE("a failed capture names the layer, stage and segment; the stream stays usable and training goes on eagerly") {
    const auto cfg = mixed(dl);
    const auto reference = eager_reference<float>(cfg, 5);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    state<float> st;
    {
        runner<captures_untagged> r(untagged(m));
        run_steps(r, m, st, 0, 2, s); // warmup: eager
        feed(m, 2, s);
        try {
            r.step(s); // ahead of time: every graph is captured before the step runs anything
            FAIL("capturing a host-synchronizing stage succeeded");
        } catch (const capture_failed& e) {
            std::printf("  capture failure: %s\n", e.what());
            CHECK(e.stage() == "layer1.moe_preprocess");
            CHECK(e.layer() == 1);
            CHECK(e.microbatch() == 0);
            const std::string what = e.what();
            CHECK(what.find("capscope: capturing graph g" + std::to_string(e.graph()) +
                            " (layer 1, microbatch 0, forward: layer1.attention, layer1.moe_router, layer1.moe_preprocess) failed in stage "
                            "'layer1.moe_preprocess'") == 0);
            CHECK(what.find("operation not permitted when stream is capturing") != std::string::npos);
        }
        CHECK(r.counters().capture_failures == 1);
        cudaStreamCaptureStatus status{};
        CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &status));
        CHECK(status == cudaStreamCaptureStatusNone);
        CHECK(cudaGetLastError() == cudaSuccess);
        r.reset();
        CHECK(r.graphs_alive() == 0);
    }
    // The trainer goes on eagerly, from the step that failed: nothing of it had run.
    runner<config<impl::eager, dropless_facts>> eager(m.training_program());
    run_steps(eager, m, st, 2, 5, s);
    record_final(m, st, s);
    check_identical(st, reference);
}

TEST_CASE("on_capture_failure<run_eagerly>: the segment that cannot be captured runs eagerly, the rest replay") {
    const auto cfg = mixed(dl);
    const auto reference = eager_reference<float>(cfg);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    using fall_back = config<lo, modules<c::attention, c::moe_router, c::moe_preprocess>, dropless_facts, w2,
                             on_capture_failure<capture_failure::run_eagerly>, capture_with<capture_mode::global>>;
    runner<fall_back> r(untagged(m));
    state<float> st;
    run_steps(r, m, st, 0, steps, s);
    record_final(m, st, s);
    std::printf("  fallback: %d of %d graphs run eagerly, %ld capture failure(s), %ld replays\n", r.graphs_run_eagerly(),
                r.plan().graph_count, r.counters().capture_failures, r.counters().replays);
    CHECK(r.counters().capture_failures == 1);
    CHECK(r.graphs_run_eagerly() == 1);
    CHECK(r.graphs_alive() == r.plan().graph_count - 1);
    CHECK(r.counters().replays > 0);
    check_identical(st, reference);
}

TEST_CASE("reset() frees every graph and returns to eager; training goes on with identical results") {
    const auto cfg = mixed(dp);
    const auto reference = eager_reference<float>(cfg, 8);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    runner<config<lo, modules<>, dp_facts, w2>> r(m.training_program());
    state<float> st;
    for (int step = 0; step < 8; ++step) {
        if (step == 4) {
            CHECK(r.graphs_alive() == r.plan().graph_count);
            r.reset();
            CHECK(r.graphs_alive() == 0);
        }
        feed(m, step, s);
        r.step(s);
        record_losses(m, st, s);
    }
    record_final(m, st, s);
    CHECK(r.counters().captures == 2 * r.plan().graph_count); // captured again after the second warmup
    CHECK(r.counters().replays == 4L * r.plan().graph_launches_per_step());
    check_identical(st, reference);
}

// Not run under compute-sanitizer, whose own bookkeeping allocates device memory.
TEST_CASE("replays allocate no device memory") {
    const auto cfg = mixed(dp);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    runner<config<te, modules<>, dp_facts, w2>> per_layer(m.training_program());
    runner<config<impl::whole_iteration, dp_facts, no_nan_check, w2>> whole(m.training_program());
    auto measure = [&](auto& r, const char* what) {
        for (int i = 0; i < 3; ++i) { // warmup, then capture and first replay
            feed(m, i, s);
            r.step(s);
        }
        s.synchronize();
        std::size_t free_before = 0, free_after = 0, total = 0;
        std::uint64_t graph_mem_before = 0, graph_mem_after = 0;
        CAPSCOPE_CHECK(cudaMemGetInfo(&free_before, &total));
        CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &graph_mem_before));
        for (int i = 3; i < 13; ++i) {
            feed(m, i, s);
            r.step(s);
        }
        s.synchronize();
        CAPSCOPE_CHECK(cudaMemGetInfo(&free_after, &total));
        CAPSCOPE_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &graph_mem_after));
        std::printf("  %s: free device memory %zu -> %zu bytes over 10 replayed steps; graph memory %llu -> %llu\n", what, free_before,
                    free_after, (unsigned long long)graph_mem_before, (unsigned long long)graph_mem_after);
        CHECK(free_after == free_before);
        CHECK(graph_mem_after == graph_mem_before);
    };
    measure(per_layer, "transformer_engine, whole layers");
    measure(whole, "full_iteration");
}

TEST_CASE("dropout: a generator in device memory draws new masks on every replay, bit for bit like eager") {
    gpt::model_config cfg = mixed(dp);
    cfg.hidden_dropout = 0.1f;
    const auto reference = eager_reference<float>(cfg);
    auto check = [&]<class Config>(Config, const char* name) {
        runner_counters counters;
        std::string plan_line;
        const auto got = run_with_runner<Config, float>(cfg, counters, plan_line);
        std::printf("  dropout 0.1, %-32s: %s; identical bits: %s\n", name, plan_line.c_str(), identical(got, reference) ? "yes" : "NO");
        check_identical(got, reference);
    };
    check(config<lo, modules<>, dp_facts, w2>{}, "local, whole layers");
    check(config<te, modules<c::attention, c::mlp>, dp_facts, w2>{}, "transformer_engine, attn+mlp");
    check(config<impl::whole_iteration, dp_facts, no_nan_check, w2>{}, "full_iteration");

    // The masks of replayed steps differ from step to step, and the offset advances on the device:
    // one draw per dense MLP per microbatch.
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    runner<config<te, modules<>, dp_facts, w2>> r(m.training_program());
    const auto masks = m.dropout_masks();
    REQUIRE(masks.size() == 2); // layers 0 and 3 are dense
    const std::size_t n = std::size_t(cfg.tokens()) * cfg.hidden;
    std::vector<std::vector<unsigned char>> seen;
    std::uint64_t offset = m.generator(s).offset;
    for (int step = 0; step < 5; ++step) {
        feed(m, step, s);
        r.step(s);
        const gpt::rng_state g = m.generator(s);
        CHECK(g.offset == offset + 2 * cfg.microbatches);
        offset = g.offset;
        seen.push_back(support::download(masks[0], n, s));
    }
    CHECK(r.counters().replays > 0);
    int dropped = 0;
    for (unsigned char k : seen.back()) dropped += k ? 0 : 1;
    std::printf("  dropout masks: %d of %zu dropped in the last replayed step (p = 0.1); offset %llu after 5 steps\n", dropped, n,
                (unsigned long long)offset);
    CHECK(dropped > 0);
    for (int step = 3; step < 5; ++step) CHECK(seen[std::size_t(step)] != seen[std::size_t(step - 1)]); // replayed steps: new masks
}
