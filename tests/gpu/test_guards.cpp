// Guarded stages on the GPU (capscope/stage/stage_guard.hpp): an optimizer that runs only when
// its flag holds (IF), and a loop inside layer 1 that runs as many passes as a device counter
// says (WHILE). Captured, each run of guarded stages is a conditional node; eager, the runner
// reads the flag on the host. Every impl must give the values worked out below, step by step,
// which are the eager ones; integer kernels, so any difference is a wrong decision.

#include "breakage.hpp"
#include "engine_kernels.hpp"
#include "support.hpp"
#include "synthetic_stages.hpp"

#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

constexpr int n = 1024;
using synthetic::ints;
using synthetic::ref;
//! A stage of `layer` in no named region, its buffers declared.
stage make_stage(std::string name, int layer, stream_fn fwd, stream_fn bwd) { return synthetic::make_stage(std::move(name), layer, {}, fwd, bwd); }

//! step j (counted from 1 on the device): layer l's forward writes act = j + l, its backward
//! grad = 2 act. step_end: `check` sets all_finite = (j % 3 != 0) (every third step "overflows"),
//! and the optimizer, guarded by it, adds grad0 + grad1 = 4 j + 2 into w. Inside layer 1's
//! forward, `loop.start` sets remaining = j % 4 and again = remaining > 0, and `loop.pass`,
//! guarded by WHILE again, counts passes until remaining is 0. Its backward, guarded by the same
//! flag, would count passes_back, but the forward's loop left the flag clear: it never runs.
//! (Under full_iteration the forward and the backward call of `loop.pass` are next to each other
//! in the one segment; they stay two nodes.)
struct guarded_model {
    ints counter{1}, w{n}, all_finite{1}, remaining{1}, again{1}, passes{1}, passes_back{1};
    ints act[2] = {ints(n), ints(n)}, grad[2] = {ints(n), ints(n)};
    struct layer_fns {
        guarded_model* m;
        int l;
        void forward(cudaStream_t s) { k::fill_from(m->act[l].data(), m->counter.data(), l, n, s); }
        void backward(cudaStream_t s) { k::scale(m->grad[l].data(), m->act[l].data(), 2, n, s); }
    } fns[2] = {{this, 0}, {this, 1}};
    void advance(cudaStream_t s) { k::add_one(counter.data(), s); }
    void check(cudaStream_t s) { k::flag_unless_multiple(all_finite.data(), counter.data(), 3, s); }
    void optimizer(cudaStream_t s) {
        k::add(w.data(), w.data(), grad[0].data(), n, s);
        k::add(w.data(), w.data(), grad[1].data(), n, s);
    }
    void loop_start(cudaStream_t s) { k::start_countdown(remaining.data(), again.data(), counter.data(), 4, s); }
    void loop_pass(cudaStream_t s) { k::count_down(remaining.data(), again.data(), passes.data(), s); }
    void loop_pass_back(cudaStream_t s) { k::count_down(remaining.data(), again.data(), passes_back.data(), s); }

    training_program program() {
        training_program p;
        p.step_begin.push_back(make_stage("advance", -1, stream_fn::of<&guarded_model::advance>(this), {}));
        p.step_begin.back().outputs = {ref(counter, "counter")};
        p.microbatches.emplace_back();
        for (int l = 0; l < 2; ++l) {
            const std::string name = "layer" + std::to_string(l);
            stage work = make_stage(name + ".work", l, stream_fn::of<&layer_fns::forward>(&fns[l]), stream_fn::of<&layer_fns::backward>(&fns[l]));
            work.inputs = {ref(counter, "counter")};
            work.outputs = {ref(act[l], "act")};
            work.backward_outputs = {ref(grad[l], "grad")};
            p.microbatches[0].push_back(std::move(work));
        }
        stage start = make_stage("layer1.loop.start", 1, stream_fn::of<&guarded_model::loop_start>(this), {});
        start.inputs = {ref(counter, "counter")};
        start.outputs = {ref(remaining, "remaining"), ref(again, "again")};
        p.microbatches[0].push_back(std::move(start));
        stage pass = make_stage("layer1.loop.pass", 1, stream_fn::of<&guarded_model::loop_pass>(this),
                                stream_fn::of<&guarded_model::loop_pass_back>(this));
        pass.outputs = {ref(remaining, "remaining"), ref(again, "again"), ref(passes, "passes")};
        pass.backward_outputs = {ref(remaining, "remaining"), ref(again, "again"), ref(passes_back, "passes_back")};
        pass.guard = run_while(ref(again, "again"));
        p.microbatches[0].push_back(std::move(pass));
        stage chk = make_stage("check", -1, stream_fn::of<&guarded_model::check>(this), {});
        chk.inputs = {ref(counter, "counter")};
        chk.outputs = {ref(all_finite, "all_finite")};
        p.step_end.push_back(std::move(chk));
        stage opt = make_stage("optimizer", -1, stream_fn::of<&guarded_model::optimizer>(this), {});
        opt.inputs = {ref(grad[0], "grad0"), ref(grad[1], "grad1")};
        opt.outputs = {ref(w, "w")};
        opt.guard = run_if(ref(all_finite, "all_finite"));
        p.step_end.push_back(std::move(opt));
        return p;
    }
};

template <class Config>
void check_guards(const char* name, long conditional_nodes) {
    cuda::stream s;
    guarded_model m;
    for (ints* b : {&m.counter, &m.w, &m.passes, &m.passes_back}) b->fill_bytes(0, s);
    runner<Config> r(m.program());
    int expected_w = 0, expected_passes = 0, wrong_step = 0;
    for (int j = 1; j <= 9; ++j) {
        r.step(s);
        if (j % 3 != 0) expected_w += 4 * j + 2; // the optimizer ran
        expected_passes += j % 4;                // the loop's passes
        const std::vector<int> w = support::download(m.w.data(), m.w.size(), s);
        const int passes = support::download(m.passes.data(), 1, s)[0];
        const int passes_back = support::download(m.passes_back.data(), 1, s)[0];
        bool right = passes == expected_passes && passes_back == 0;
        for (int x : w) right = right && x == expected_w;
        if (!right && !wrong_step) {
            wrong_step = j;
            std::printf("  %s, step %d: w[0] = %d (expected %d), passes = %d (expected %d), backward passes = %d (expected 0)\n", name, j,
                        w[0], expected_w, passes, expected_passes, passes_back);
        }
    }
    std::printf("  guards, %-34s: %d graphs, %ld conditional nodes captured, %ld host reads of a flag, %ld replays; every step as eager: %s\n",
                name, r.plan().graph_count, r.counters().conditional_nodes, r.counters().guard_reads, r.counters().replays,
                wrong_step ? "NO" : "yes");
    CHECK_MESSAGE(wrong_step == 0, name);
    CHECK_MESSAGE(r.counters().conditional_nodes == conditional_nodes, name);
}

using lo = impl::lazy_per_layer;
using te = impl::ahead_of_time_per_layer;
using w1 = warmup_steps<1>;

} // namespace

TEST_CASE("guarded stages: IF skips the optimizer and WHILE loops inside a layer, captured as conditional nodes, as eager under every impl") {
    if (capscope::detail::installed_breakage().ignore_guards)
        std::printf("  broken on purpose: the runner ignores every guard (the guarded stages always run once)\n");
    check_guards<config<impl::eager>>("none (the flags read on the host)", 0);
    // Per layer: layer 1's forward graph and its backward graph hold a WHILE node each; step_end
    // is eager (a host read).
    check_guards<config<lo, modules<>, w1>>("local, whole layers", 2);
    check_guards<config<te, modules<>, w1>>("transformer_engine, whole layers", 2);
    // The whole step: one graph with all three nodes (the forward's and the backward's WHILE stay two).
    check_guards<config<impl::whole_iteration, no_nan_check, w1>>("full_iteration", 3);

    guarded_model m;
    runner<config<impl::whole_iteration, no_nan_check, w1>> whole(m.program());
    const std::string text = whole.plan_text();
    std::printf("%s", text.c_str());
    CHECK(text.find("layer1.loop.pass (microbatch 0 forward): in conditional node WHILE 'again'") != std::string::npos);
    CHECK(text.find("optimizer: in conditional node IF 'all_finite'") != std::string::npos);
    runner<config<lo, modules<>, w1>> local(m.program());
    std::printf("%s", local.plan_text().c_str());
    CHECK(local.plan_text().find("layer1.work layer1.loop.start WHILE 'again' { layer1.loop.pass }  [conditional nodes: WHILE 'again']") !=
          std::string::npos);
}

// ---- the example model's NaN/inf check on the device (nan_check_on_device) ------------------------

namespace {

//! A test stage at the front of step_end (after the backward, before the check): writes +inf
//! into the first gradient at the `at`-th step, counted on the device, so that a replayed step
//! overflows as an eager one does.
struct inject_inf {
    float* grads;
    int* counter;
    int at;
    void run(cudaStream_t s) { k::inf_at_count(grads, counter, at, s); }
};

struct checked_run {
    std::vector<std::vector<float>> masters; //!< after each step
    std::vector<float> losses;
    std::vector<int> skipped_by;                    //!< skipped steps so far, after each step
    std::vector<gpt::loss_scale_state> scale_after; //!< after each step (dynamic loss scaling)
    int skipped = -1;
};

template <class Config, class T> checked_run run_checked(int inf_at, int steps, gpt::loss_scaling scaling = {}) {
    cuda::stream s;
    gpt::model_config cfg = support::small_model("DEMD", gpt::moe_mode::drop_and_pad, 1.0);
    cfg.microbatches = 2;
    cfg.check_finite_on_device = true;
    cfg.loss_scale = scaling;
    gpt::gpt_model<T> m(cfg, s);
    ints counter(1);
    counter.fill_bytes(0, s);
    training_program p = m.training_program();
    inject_inf inject{m.parameters().grads(), counter.data(), inf_at};
    stage st = make_stage("inject_inf", -1, stream_fn::of<&inject_inf::run>(&inject), {});
    st.inputs = {ref(counter, "inject.counter")};
    st.outputs = {{"grads", m.parameters().grads(), sizeof(float)}, ref(counter, "inject.counter")};
    p.step_end.insert(p.step_end.begin(), std::move(st));
    if (breakage::broken("drop_loss_scale_update")) // broken on purpose: the stage that halves and grows the scale is gone
        std::erase_if(p.step_end, [](const stage& x) { return x.name == "update_loss_scale"; });
    runner<Config> r(std::move(p));
    checked_run out;
    for (int step = 0; step < steps; ++step) {
        for (int mb = 0; mb < cfg.microbatches; ++mb) {
            const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 500 + 10 * std::uint64_t(step) + mb);
            m.set_batch(mb, b.tokens, b.labels, s);
        }
        gpt::adamw_config o;
        o.lr = 1e-3f * float(1 + step % 3);
        m.set_optimizer(o, s);
        r.step(s);
        out.losses.push_back(m.loss(s));
        out.masters.push_back(support::download(m.parameters().masters(), m.parameters().total(), s));
        out.skipped_by.push_back(m.skipped_steps(s));
        out.scale_after.push_back(m.loss_scale(s));
    }
    out.skipped = m.skipped_steps(s);
    return out;
}

bool same_states(const std::vector<gpt::loss_scale_state>& a, const std::vector<gpt::loss_scale_state>& b) {
    bool same = a.size() == b.size();
    for (std::size_t i = 0; same && i < a.size(); ++i)
        same = a[i].scale == b[i].scale && a[i].inverse == b[i].inverse && a[i].clean_steps == b[i].clean_steps;
    return same;
}

//! The same losses, weights after every step and loss-scale states, bit for bit.
bool same_run(const checked_run& a, const checked_run& b) {
    bool same = support::same_bits(a.losses, b.losses) && same_states(a.scale_after, b.scale_after) && a.masters.size() == b.masters.size();
    for (std::size_t i = 0; same && i < a.masters.size(); ++i) same = support::same_bits(a.masters[i], b.masters[i]);
    return same;
}

template <class Config, class T> void check_finite_case(const char* name, const checked_run& eager, int inf_at) {
    const checked_run got = run_checked<Config, T>(inf_at, int(eager.masters.size()));
    const bool same = same_run(got, eager);
    const int k = inf_at - 1; // the step (from 0) whose gradients overflow
    const bool skipped_k = support::same_bits(got.masters[std::size_t(k)], got.masters[std::size_t(k - 1)]);
    const bool moved_after = !support::same_bits(got.masters[std::size_t(k + 1)], got.masters[std::size_t(k)]);
    std::printf("  nan_check_on_device, %-34s: skipped steps %d; step %d left the weights as they were: %s; the next step moved them: %s; "
                "bitwise equal to eager: %s\n",
                name, got.skipped, k, skipped_k ? "yes" : "NO", moved_after ? "yes" : "NO", same ? "yes" : "NO");
    CHECK_MESSAGE(got.skipped == 1, name);
    CHECK_MESSAGE(skipped_k, name);
    CHECK_MESSAGE(moved_after, name);
    CHECK_MESSAGE(same, name);
}

template <class T> void check_finite_all_impls() {
    constexpr int steps = 6, inf_at = 4; // the 4th step (index 3) overflows
    const checked_run eager = run_checked<config<impl::eager, nan_check_on_device>, T>(inf_at, steps);
    CHECK(eager.skipped == 1);
    check_finite_case<config<lo, modules<>, w1, nan_check_on_device>, T>("local, whole layers", eager, inf_at);
    check_finite_case<config<te, modules<capture::attention, capture::mlp>, w1, nan_check_on_device>, T>("transformer_engine, attn mlp", eager, inf_at);
    // A1 refuses the whole step with Megatron's host-side check; on the device it composes.
    check_finite_case<config<impl::whole_iteration, w1, nan_check_on_device>, T>("full_iteration", eager, inf_at);
}

} // namespace

TEST_CASE_TEMPLATE("nan_check_on_device: an inf at step k skips that update inside the graph, bit for bit like eager, under every impl", T,
                   float, __nv_bfloat16, __half) {
    check_finite_all_impls<T>();
}

// ---- dynamic loss scaling (model_config::loss_scale), the finite check's other half ------------

namespace {

//! The scale each step should leave, worked out on the host from which steps were skipped:
//! halved by a skipped step, doubled by `growth_interval` finite steps in a row.
std::vector<gpt::loss_scale_state> expected_scales(const gpt::loss_scaling& ls, const std::vector<int>& skipped_by) {
    std::vector<gpt::loss_scale_state> out;
    gpt::loss_scale_state st{ls.initial, 1.f / ls.initial, 0};
    for (std::size_t j = 0; j < skipped_by.size(); ++j) {
        const bool skipped = skipped_by[j] != (j ? skipped_by[j - 1] : 0);
        if (skipped) st.scale = std::max(st.scale / 2, gpt::loss_scale_state::smallest), st.clean_steps = 0;
        else if (++st.clean_steps >= ls.growth_interval) st.scale = std::min(st.scale * 2, gpt::loss_scale_state::largest), st.clean_steps = 0;
        st.inverse = 1.f / st.scale;
        out.push_back(st);
    }
    return out;
}

std::string scales_text(const std::vector<gpt::loss_scale_state>& v) {
    std::string t;
    for (const auto& st : v) t += (t.empty() ? "" : " ") + std::to_string(int(st.scale));
    return t;
}

template <class Config, class T>
void loss_scaling_case(const char* name, const checked_run& eager, const checked_run* unscaled, int inf_at, const gpt::loss_scaling& ls) {
    const checked_run got = run_checked<Config, T>(inf_at, int(eager.masters.size()), ls);
    const bool same = same_run(got, eager);
    const auto want = expected_scales(ls, got.skipped_by);
    const bool followed = same_states(got.scale_after, want);
    const int k = inf_at - 1;
    const bool skipped_k = got.skipped_by[std::size_t(k)] == (k ? got.skipped_by[std::size_t(k - 1)] : 0) + 1;
    // A power-of-two scale multiplies and divides exactly: where nothing under- or overflows,
    // every weight equals the unscaled run's, bit for bit (a scale not divided out moves AdamW's
    // update through its eps, and fails this).
    bool as_unscaled = true;
    if (unscaled)
        for (std::size_t i = 0; i < eager.masters.size(); ++i) as_unscaled = as_unscaled && support::same_bits(got.masters[i], unscaled->masters[i]);
    std::printf("  loss scaling %s, %-30s: scale after each step %s (expected %s); skipped %d, step %d among them: %s; bitwise equal to "
                "eager: %s%s\n",
                support::precision_name<T>, name, scales_text(got.scale_after).c_str(), scales_text(want).c_str(), got.skipped, k,
                skipped_k ? "yes" : "NO", same ? "yes" : "NO", unscaled ? (as_unscaled ? "; weights equal to the unscaled run's: yes" : "; weights equal to the unscaled run's: NO") : "");
    CHECK_MESSAGE(followed, name);
    CHECK_MESSAGE(got.skipped == 1, name); // the injected step alone: nothing overflows on its own
    CHECK_MESSAGE(skipped_k, name);
    CHECK_MESSAGE(same, name);
    CHECK_MESSAGE(as_unscaled, name);
}

template <class T> void loss_scaling_all_impls() {
    constexpr int steps = 7, inf_at = 4; // the 4th step (index 3) overflows
    gpt::loss_scaling ls;
    ls.dynamic = true;
    ls.initial = 1024.f;
    ls.growth_interval = 2; // grows once before the overflow (after step 1), halves at it, grows once after (step 5)
    const checked_run eager = run_checked<config<impl::eager, nan_check_on_device>, T>(inf_at, steps, ls);
    // fp16 loses the small gradients without the scale, so only fp32 and bf16 compare with the unscaled run.
    const bool exact = !std::is_same_v<T, __half>;
    const checked_run unscaled = run_checked<config<impl::eager, nan_check_on_device>, T>(inf_at, steps);
    const checked_run* cmp = exact ? &unscaled : nullptr;
    loss_scaling_case<config<impl::eager, nan_check_on_device>, T>("eager", eager, cmp, inf_at, ls);
    loss_scaling_case<config<lo, modules<>, w1, nan_check_on_device>, T>("local, whole layers", eager, cmp, inf_at, ls);
    loss_scaling_case<config<te, modules<capture::attention, capture::mlp>, w1, nan_check_on_device>, T>("transformer_engine, attn mlp", eager,
                                                                                                          cmp, inf_at, ls);
    loss_scaling_case<config<impl::whole_iteration, w1, nan_check_on_device>, T>("full_iteration", eager, cmp, inf_at, ls);
}

} // namespace

TEST_CASE_TEMPLATE("dynamic loss scaling: an inf at step k skips it and halves the scale, finite steps grow it, on the device under every impl",
                   T, float, __nv_bfloat16, __half) {
    loss_scaling_all_impls<T>();
}

TEST_CASE("dynamic loss scaling in fp16: a scale too large for fp16 backs off on the device until the gradients fit, then trains") {
    // 2^24 times the loss gradient overflows fp16 in the backward: those steps are skipped and
    // halve the scale, until it fits; the steps after it move the weights, and the loss stays finite.
    constexpr int steps = 14;
    gpt::loss_scaling ls;
    ls.dynamic = true;
    ls.initial = 16777216.f;
    ls.growth_interval = 1000;
    const checked_run eager = run_checked<config<impl::eager, nan_check_on_device>, __half>(/*no injection*/ 0, steps, ls);
    const checked_run graph = run_checked<config<impl::whole_iteration, w1, nan_check_on_device>, __half>(0, steps, ls);
    const bool same = same_run(graph, eager);
    const auto want = expected_scales(ls, graph.skipped_by);
    bool finite = true;
    for (float l : graph.losses) finite = finite && std::isfinite(l);
    // Skipped steps come first, so the weights after the first update are those at index `skipped`.
    REQUIRE_MESSAGE(graph.skipped < steps - 2, "the scale never came down far enough for fp16");
    const bool moved = !support::same_bits(graph.masters.back(), graph.masters[std::size_t(graph.skipped)]);
    std::printf("  loss scaling fp16 from 2^24, full_iteration: scale after each step %s; skipped %d; losses finite: %s; the weights "
                "moved after: %s; bitwise equal to eager: %s\n",
                scales_text(graph.scale_after).c_str(), graph.skipped, finite ? "yes" : "NO", moved ? "yes" : "NO", same ? "yes" : "NO");
    CHECK(graph.skipped >= 1);
    CHECK(graph.skipped < steps - 2);
    CHECK(same_states(graph.scale_after, want));
    CHECK(graph.scale_after.back().scale < ls.initial);
    CHECK(finite);
    CHECK(moved);
    CHECK(same);
}

TEST_CASE("nan_check_on_device: a program whose optimizer is not guarded is refused (P17)") {
    cuda::stream s;
    gpt::gpt_model<float> m(support::small_model("D", gpt::moe_mode::drop_and_pad, 1.0), s); // check_finite_on_device off
    try {
        runner<config<impl::whole_iteration, w1, nan_check_on_device>> r(m.training_program());
        FAIL("no error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P17");
        CHECK(std::string(e.what()).find("no optimizer stage of step_end (stage_kind::optimizer) is guarded by run_if") != std::string::npos);
    }
}
