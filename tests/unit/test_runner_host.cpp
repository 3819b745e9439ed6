// The runner's call order, on the host (no GPU: eager steps make no CUDA call). Each fake stage
// logs its calls; the log must be the order a training step promises, written out here by hand
// from the program, not from the plan: step begin, each microbatch's forwards in order and
// backwards in reverse, step end. Warmup steps of every impl run it so too.

#include "fake_program.hpp"

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>

#include "fake_stream.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace capscope;

namespace {

//! The promised order of one step, from the program alone.
std::vector<std::string> promised_order(const training_program& p) {
    std::vector<std::string> out;
    auto name = [](const stage& s, const char* phase) { return s.name.substr(0, s.name.find('#')) + phase; };
    for (const stage& s : p.step_begin) out.push_back(name(s, ".fwd"));
    for (const auto& list : p.microbatches) {
        for (const stage& s : list)
            if (s.forward) out.push_back(name(s, ".fwd"));
        for (auto it = list.rbegin(); it != list.rend(); ++it)
            if (it->backward) out.push_back(name(*it, ".bwd"));
    }
    for (const stage& s : p.step_end) out.push_back(name(s, ".fwd"));
    return out;
}

using host_tests::fake_stream;

template <class Config>
void check_warmup_order(const char* what) {
    fake::model m;
    const training_program p = m.program("DEM", false, 2);
    const auto want = promised_order(p);
    runner<Config> r(p);
    for (int step = 0; step < Config::warmup_steps || (Config::impl == graph_impl::eager && step < 2); ++step) {
        m.log.clear();
        r.step(fake_stream);
        CHECK_MESSAGE(m.log == want, what, ", step ", step);
    }
    CHECK(r.counters().captures == 0);
}

} // namespace

TEST_CASE("eager steps and warmup steps call the stages in the promised order, under every impl") {
    check_warmup_order<config<impl::eager>>("none");
    check_warmup_order<config<impl::lazy_per_layer, modules<capture::attention>, warmup_steps<2>>>("local");
    check_warmup_order<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>>("transformer_engine");
    check_warmup_order<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>>("full_iteration");
}

TEST_CASE("a frozen layer (no backward) and a backward-only stage are called in their one phase") {
    fake::model m;
    training_program p = m.program("DD", false, 1);
    p.microbatches[0][1].backward = {}; // layer0.attention frozen
    p.microbatches[0][4].forward = {};  // layer1.mlp: backward only
    runner<config<impl::eager>> r(p);
    r.step(fake_stream);
    CHECK(m.log == std::vector<std::string>{"zero_grad.fwd", "embedding.fwd", "layer0.attention.fwd", "layer0.mlp.fwd",
                                            "layer1.attention.fwd", "head.fwd", "head.bwd", "layer1.mlp.bwd", "layer1.attention.bwd",
                                            "layer0.mlp.bwd", "embedding.bwd", "optimizer.fwd"});
}

TEST_CASE("the runner counts what it ran, and its counters saturate instead of wrapping") {
    fake::model m;
    runner<config<impl::eager>> r(m.program("D", false, 1));
    r.step(fake_stream);
    CHECK(r.counters().steps == 1);
    CHECK(r.counters().eager_segment_runs == long(r.plan().segments.size()));
    long almost = std::numeric_limits<long>::max() - 1;
    detail::count_one(almost);
    detail::count_one(almost);
    CHECK(almost == std::numeric_limits<long>::max());
    long total = std::numeric_limits<long>::max() - 5, longest = 3;
    detail::add_time(total, longest, 7); // start-up times saturate too, and keep the longest
    CHECK(total == std::numeric_limits<long>::max());
    CHECK(longest == 7);
}

TEST_CASE("nan_check_on_device needs the optimizer guarded by the check's flag (P17); guarded, the runner is made") {
    fake::model m;
    training_program p = m.program("D", false, 1);
    try {
        runner<config<impl::whole_iteration, nan_check_on_device>> r(p);
        FAIL("no error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P17");
    }
    int flag = 0;
    const tensor_ref all_finite{"all_finite", &flag, sizeof flag};
    stage check = m.make("check_finite", -1, stage_kind::other, {}, &m.buffers[61]);
    check.backward = {};
    check.outputs.push_back(all_finite);
    p.step_end.insert(p.step_end.begin(), check);
    p.step_end.back().guard = run_if(all_finite);
    // A model that updates layer by layer: every optimizer stage guarded, or the unguarded one named.
    training_program by_layer = p;
    stage second = by_layer.step_end.back();
    second.name = "optimizer (layer 0)";
    second.guard = {};
    by_layer.step_end.push_back(second);
    try {
        runner<config<impl::whole_iteration, nan_check_on_device>> r(by_layer);
        FAIL("no error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P17");
        CHECK(std::string(e.what()).find("the optimizer stage 'optimizer (layer 0)' is not guarded") != std::string::npos);
    }
    runner<config<impl::whole_iteration, nan_check_on_device>> r(p); // no runner without the option checks this
    CHECK(r.plan().graph_count == 1);
}

TEST_CASE("a step the device may refuse (training_program::rerun) is checked when a runner is made (P18)") {
    using moe_local = config<impl::lazy_per_layer, modules<capture::moe>, model<experts<4>, moe_pattern<0, 1>>, static_expert_capacity>;
    fake::model m;
    training_program p = m.program("DE", false, 1);
    auto rule_of = [](auto make) -> std::string {
        try {
            make();
        } catch (const plan_error& e) {
            return std::string(e.rule()) + ": " + e.what();
        }
        return "no error";
    };
    // The config says the capacity is static, but the program declares no rerun.
    const std::string none = rule_of([&] { runner<moe_local> r(p); });
    CHECK(none.rfind("P18", 0) == 0);
    CHECK(none.find("would drop tokens silently") != std::string::npos);

    int overflow = 0, may_update = 1;
    const tensor_ref flag{"expert_overflow", &overflow, sizeof overflow};
    const tensor_ref gate_flag{"may_update", &may_update, sizeof may_update};
    p.rerun.flag = flag;
    p.rerun.reason = "an expert got more tokens than its static capacity";
    CHECK(rule_of([&] { runner<moe_local> r(p); }).find("has no 'before' function") != std::string::npos);
    fake::recorder before{&m.log, "rerun.before"};
    p.rerun.before = stream_fn::of<&fake::recorder::forward>(&before);
    CHECK(rule_of([&] { runner<moe_local> r(p); }).find("no step_begin stage writes the rerun flag 'expert_overflow'") != std::string::npos);
    p.step_begin.front().outputs.push_back(flag);
    CHECK(rule_of([&] { runner<moe_local> r(p); }).find("no optimizer stage of step_end is guarded by run_if") != std::string::npos);
    p.step_end.back().guard = run_if(flag); // inverted: it would update exactly in the refused steps
    CHECK(rule_of([&] { runner<moe_local> r(p); }).find("guarded by the rerun flag 'expert_overflow' itself") != std::string::npos);
    p.step_end.back().guard = run_if(gate_flag);
    CHECK(rule_of([&] { runner<moe_local> r(p); }).find("which no step_end stage before it writes from the rerun flag") != std::string::npos);
    stage gate = m.make("update_gate", -1, stage_kind::other, {}, &may_update);
    gate.backward = {};
    gate.inputs = {flag};
    gate.outputs = {gate_flag};
    p.step_end.insert(p.step_end.begin(), gate);
    // Every optimizer stage is guarded, where a model updates layer by layer.
    training_program by_layer = p;
    stage second = by_layer.step_end.back();
    second.name = "optimizer (layer 0)";
    second.guard = {};
    by_layer.step_end.push_back(second);
    CHECK(rule_of([&] { runner<moe_local> r(by_layer); }).find("the optimizer stage 'optimizer (layer 0)' is not guarded by run_if") != std::string::npos);
    // A collective would run twice on the refused rank only.
    training_program with_collective = p;
    stage reduce = m.make("grad all-reduce (outside the layers)", -1, stage_kind::other, {}, &m.buffers[62]);
    reduce.kind = stage_kind_id("collective");
    reduce.backward = {};
    with_collective.step_end.insert(with_collective.step_end.begin(), reduce);
    CHECK(rule_of([&] { runner<moe_local> r(with_collective); }).find("the ranks' collectives would no longer match") != std::string::npos);
    // ... and so would a hook on the step's own stream that declares collective calls (an all-reduce
    // on lane 0): refused by what it declares, not by where it runs.
    struct all_reduce_on_lane_0 {
        void operator()(backward_context&) const {}
        std::string collective_calls(int) const { return "all-reduce float32 avg"; }
    };
    const hook_pipeline reduce_here{hook<hook_phase::backward, capturable>("grad all-reduce", all_reduce_on_lane_0{})};
    const std::vector<layer_tensors> two(2);
    CHECK(rule_of([&] { runner<moe_local> r(with_hooks(p, reduce_here, two)); }).find("the ranks' collectives would no longer match") !=
          std::string::npos);

    for (auto& list : p.microbatches)
        for (stage& s : list)
            if (s.kind == stage_kind::moe_preprocess) s.outputs.push_back(flag);
    runner<moe_local> r(p);
    const std::string text = r.plan_text();
    CHECK(text.find("after the step: 'expert_overflow' read on the host; when set (an expert got more tokens than its static capacity), "
                    "the step is refused (its optimizer guarded) and run again, every call eagerly") != std::string::npos);
    // The plan's own part: some call writes the flag (here no call at all, the runner's checks aside).
    training_program unwritten = p;
    unwritten.step_begin.front().outputs.pop_back();
    for (auto& list : unwritten.microbatches)
        for (stage& s : list)
            if (s.kind == stage_kind::moe_preprocess) s.outputs.pop_back();
    CHECK(rule_of([&] { make_training_plan(capture_scope_of<moe_local>, 1, unwritten); }).find("is written by no call of the step") != std::string::npos);
    // The rerun survives composition.
    const hook_pipeline hooks{hook<hook_phase::backward, capturable>("log", [](backward_context&) {})};
    const std::vector<layer_tensors> tensors(2);
    const training_program hooked = with_hooks(p, hooks, tensors);
    CHECK(hooked.rerun.flag == flag);
}
