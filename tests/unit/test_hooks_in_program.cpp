// Hooks as stages of the training program (hooks/with_hooks.hpp): where each phase runs, in
// declaration order, eager on the host (an eager step makes no CUDA call), and how the plan
// places them: capturable hooks inside their layer's graph, boundary hooks as eager islands.

#include "fake_program.hpp"

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>

#include "fake_stream.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace capscope;

namespace {
using host_tests::fake_stream;

using fake::where;

//! The calls of layer 0 in microbatch 0 (its forward and backward come before microbatch 1's).
std::vector<std::string> layer0_of_microbatch0(const std::vector<std::string>& log) {
    std::vector<std::string> out;
    for (const auto& e : log) {
        if (e.find("mb1") != std::string::npos) break;
        if (e.find("L0 mb0") != std::string::npos || e.rfind("layer0.", 0) == 0) out.push_back(e);
    }
    return out;
}
//! The hooks' and the attention stages' calls of the microbatches, in the order the plan issues
//! them (the backward runs the layers from the last), each marked fwd or bwd.
std::vector<std::string> hooks_and_attention_issued(const training_plan& plan, const training_program& program) {
    std::vector<std::string> issued;
    for (const stage_call& c : plan.calls) {
        const std::string& name = stage_of(program, c).name;
        if (c.part == step_part::microbatch && (name.find(".hook.") != std::string::npos || name.find(".attention") != std::string::npos))
            issued.push_back(name + (c.direction == phase::forward ? " fwd" : " bwd"));
    }
    return issued;
}
std::string fmt_log(const std::vector<std::string>& log) {
    std::string s;
    for (const auto& e : log) s += e + " | ";
    return s;
}
} // namespace

TEST_CASE("hooks run where their phase says, in declaration order, eager and under every impl's warmup") {
    fake::model m;
    auto& log = m.log;
    hook_pipeline hooks{
        hook<hook_phase::forward_pre, capturable>("gather", [&log](forward_pre_context& c) { log.push_back(where("gather", c)); }),
        hook<hook_phase::backward, capturable>("reduce A", [&log](backward_context& c) { log.push_back(where("reduce A", c)); }),
        hook<hook_phase::backward, capturable>("reduce B", [&log](backward_context& c) { log.push_back(where("reduce B", c)); }),
        hook<hook_phase::backward_pre, capturable>("regather", [&log](backward_pre_context& c) { log.push_back(where("regather", c)); }),
        hook<hook_phase::forward, boundary>("log", [&log](forward_context& c) { log.push_back(where("host log", c)); }),
        hook<hook_phase::forward, capturable, of_region<capture::mlp>>("after mlp", [&log](forward_context& c) { log.push_back(where("after mlp", c)); }),
    };
    const layer_tensors tensors[2] = {};
    const training_program program = with_hooks(m.program("DD", false, 2), hooks, tensors);

    const std::vector<std::string> want = {
        "gather L0 mb0", "layer0.attention.fwd", "layer0.mlp.fwd", "after mlp L0 mb0", "host log L0 mb0",         // forward (the region's hook first)
        "regather L0 mb0", "layer0.mlp.bwd", "layer0.attention.bwd", "reduce A L0 mb0", "reduce B L0 mb0"};       // backward
    runner<config<impl::eager>> eager(program);
    eager.step(fake_stream);
    INFO(fmt_log(log));
    CHECK(layer0_of_microbatch0(log) == want);
    CHECK(std::count(log.begin(), log.end(), "reduce B L1 mb1") == 1);

    log.clear();
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>> warmup(program);
    warmup.step(fake_stream); // the warmup step: eager, in the order captured mode uses
    CHECK(layer0_of_microbatch0(log) == want);
    CHECK(warmup.counters().captures == 0);
}

TEST_CASE("the plan: capturable hooks inside their layer's graph; a boundary hook an eager island that splits a fused segment") {
    fake::model m;
    hook_pipeline hooks{
        hook<hook_phase::backward, capturable>("grad all-reduce", [](backward_context&) {}),
        hook<hook_phase::forward_pre, boundary, of_region<capture::mlp>>("host check", [](forward_pre_context&) {}),
    };
    const layer_tensors tensors[1] = {};
    const training_program program = with_hooks(m.program("D", false, 1), hooks, tensors);
    const training_plan plan = make_training_plan({graph_impl::ahead_of_time_per_layer, region_set{}}, 1, program);

    auto segment_of = [&](const std::string& stage_name, phase dir) -> const plan_segment* {
        for (const plan_segment& s : plan.segments)
            for (int k = 0; k < s.call_count; ++k) {
                const stage_call& c = plan.calls[std::size_t(s.first_call + k)];
                if (c.direction == dir && stage_of(program, c).name == stage_name) return &s;
            }
        return nullptr;
    };
    const plan_segment* reduce = segment_of("layer0.hook.grad all-reduce", phase::backward);
    const plan_segment* attention_bwd = segment_of("layer0.attention", phase::backward);
    REQUIRE(reduce);
    CHECK(reduce->graphed);
    CHECK(reduce == attention_bwd); // captured in the same backward graph as the layer's first stage

    const plan_segment* check = segment_of("layer0.hook.host check", phase::forward);
    REQUIRE(check);
    CHECK_FALSE(check->graphed); // host work between the replays
    const plan_segment* attention = segment_of("layer0.attention", phase::forward);
    const plan_segment* mlp = segment_of("layer0.mlp", phase::forward);
    REQUIRE((attention && mlp));
    CHECK(attention != mlp); // the whole-layer graph is split at the hook: attention | host check | mlp
    CHECK(attention->graphed);
    CHECK(mlp->graphed);

    // The plan's text and DOT name every hook where it runs.
    for (const std::string& shown : {to_text(plan, program), to_dot(plan, program)}) {
        CHECK(shown.find("layer0.hook.grad all-reduce") != std::string::npos);
        CHECK(shown.find("layer0.hook.host check") != std::string::npos);
    }
}

TEST_CASE("a hook on a lane runs in a graph of its own on that side stream; last_microbatch_only gives one stage per step") {
    fake::model m;
    hook_pipeline hooks{
        hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("grad all-reduce", [](backward_context&) {}),
        hook<hook_phase::forward_pre, capturable, on_lane<2>>("gather", [](forward_pre_context&) {}),
    };
    char memory[4] = {};
    const tensor_ref params[2] = {{"layer0.params", &memory[0], 1}, {"layer1.params", &memory[1], 1}};
    const tensor_ref grads[2] = {{"layer0.grads", &memory[2], 1}, {"layer1.grads", &memory[3], 1}};
    const layer_tensors tensors[2] = {{{&params[0], 1}, {&grads[0], 1}}, {{&params[1], 1}, {&grads[1], 1}}};
    const training_program program = with_hooks(m.program("DD", false, 2), hooks, tensors);
    auto count = [](const std::vector<stage>& list, const std::string& name) {
        return std::count_if(list.begin(), list.end(), [&](const stage& s) { return s.name == name; });
    };
    CHECK(count(program.microbatches[0], "layer1.hook.grad all-reduce") == 1); // in every list, so the lists stay alike,
    CHECK(count(program.microbatches[0], "layer1.hook.gather") == 1);
    int reduce_calls = 0;

    const training_plan plan = make_training_plan({graph_impl::ahead_of_time_per_layer, region_set{}}, 1, program);
    for (const stage_call& c : plan.calls) reduce_calls += stage_of(program, c).name == "layer1.hook.grad all-reduce";
    CHECK(reduce_calls == 1); // but called in the last microbatch only: earlier microbatches accumulate
    const plan_segment* reduce = nullptr;
    const plan_segment* layer1 = nullptr;
    for (const plan_segment& s : plan.segments)
        for (int k = 0; k < s.call_count; ++k) {
            const stage_call& c = plan.calls[std::size_t(s.first_call + k)];
            if (c.microbatch != 1 || c.direction != phase::backward) continue;
            if (stage_of(program, c).name == "layer1.hook.grad all-reduce") reduce = &s;
            if (stage_of(program, c).name == "layer1.attention") layer1 = &s;
        }
    REQUIRE((reduce && layer1));
    CHECK(reduce != layer1);
    CHECK((reduce->graphed && reduce->lane == 1 && reduce->call_count == 1));
    CHECK(layer1->lane == 0);
    CHECK(reduce > layer1);                                              // right after the layer's backward graph
    // Derived: each layer's forward reads what its gather on lane 2 brought; the optimizer touches
    // every layer's parameters and gradients, so it waits for the last reduction (the gathers are
    // already waited for by the layers' forwards).
    const std::string text = to_text(plan, program);
    CHECK(text.find("graph g1     layer0.attention layer0.mlp  [waits for layer0.hook.gather on lane 2]") != std::string::npos);
    CHECK(text.find("graph g3 (shared with microbatch 0) layer1.attention layer1.mlp  [waits for layer1.hook.gather on lane 2]") != std::string::npos);
    CHECK(text.find("eager        optimizer  [waits for layer0.hook.grad all-reduce on lane 1]\n") != std::string::npos);
    CHECK(text.find("layer1.hook.grad all-reduce") != std::string::npos);
    CHECK_FALSE(find_order_violation(plan, program));
    // Microbatch 1's other graphs are still microbatch 0's (the segments are matched by position).
    int shared = 0;
    for (const plan_segment& s : plan.segments) shared += s.shared;
    CHECK(shared > 0);
}

TEST_CASE("first_microbatch_only: a gather whose buffer keeps its values for the step is called in the first microbatch only") {
    fake::model m;
    hook_pipeline hooks{hook<hook_phase::forward_pre, capturable, on_lane<1>, first_microbatch_only>("gather", [](forward_pre_context&) {})};
    char memory[4] = {};
    const tensor_ref params[2] = {{"layer0.params", &memory[0], 1}, {"layer1.params", &memory[1], 1}};
    const tensor_ref grads[2] = {{"layer0.grads", &memory[2], 1}, {"layer1.grads", &memory[3], 1}};
    const layer_tensors tensors[2] = {{{&params[0], 1}, {&grads[0], 1}}, {{&params[1], 1}, {&grads[1], 1}}};
    const training_program program = with_hooks(m.program("DD", false, 3), hooks, tensors);
    for (const auto& list : program.microbatches) // in every list, so the lists stay alike
        CHECK(std::count_if(list.begin(), list.end(), [](const stage& s) { return s.name == "layer1.hook.gather"; }) == 1);
    for (graph_impl impl : {graph_impl::eager, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration}) {
        const training_plan plan = make_training_plan({impl, region_set{}}, 1, program);
        int gathers = 0, in_first = 0;
        for (const stage_call& c : plan.calls)
            if (stage_of(program, c).name.find(".hook.gather") != std::string::npos) ++gathers, in_first += c.microbatch == 0;
        CHECK(gathers == 2); // one per layer a step, not one per layer and microbatch
        CHECK(in_first == 2);
        CHECK_FALSE(find_order_violation(plan, program));
    }
}

TEST_CASE("one_layer_ahead: layer L's gather runs beside the layer before it in the pass, and the plan orders the double buffer") {
    fake::model m;
    hook_pipeline hooks{
        hook<hook_phase::forward_pre, capturable, on_lane<1>, one_layer_ahead>("gather", [](forward_pre_context&) {}),
        hook<hook_phase::backward_pre, capturable, on_lane<1>, one_layer_ahead>("regather", [](backward_pre_context&) {}),
        hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("reduce", [](backward_context&) {}),
    };
    char memory[5] = {};
    // A double buffer: layers 0 and 2 gather into one half, layer 1 into the other.
    const tensor_ref halves[2] = {{"full0", &memory[0], 1}, {"full1", &memory[1], 1}};
    const tensor_ref grads[3] = {{"layer0.grads", &memory[2], 1}, {"layer1.grads", &memory[3], 1}, {"layer2.grads", &memory[4], 1}};
    const layer_tensors tensors[3] = {{{&halves[0], 1}, {&grads[0], 1}}, {{&halves[1], 1}, {&grads[1], 1}}, {{&halves[0], 1}, {&grads[2], 1}}};
    const training_program program = with_hooks(m.program("DDD", false, 1), hooks, tensors);
    for (const graph_impl impl : {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration}) {
        CAPTURE(impl);
        const training_plan plan = make_training_plan({impl, region_set{}}, 1, program);
        const std::vector<std::string> issued = hooks_and_attention_issued(plan, program);
        const std::vector<std::string> want = {
            "layer0.hook.gather fwd",   "layer1.hook.gather fwd",   "layer0.attention fwd", // the pass's first layer: its own, then the next
            "layer2.hook.gather fwd",   "layer1.attention fwd",     "layer2.attention fwd", // layer 2's gather while layer 1 computes
            "layer2.hook.regather bwd", "layer1.hook.regather bwd", "layer2.attention bwd", // coming down: the last layer first
            "layer2.hook.reduce bwd",   "layer0.hook.regather bwd", "layer1.attention bwd",
            "layer1.hook.reduce bwd",   "layer0.attention bwd",     "layer0.hook.reduce bwd"};
        INFO(fmt_log(issued));
        CHECK(issued == want);
        // Each gather is a segment of its own on the lane (one graph per layer's gather), so the
        // pass's first layer waits for its own gather only, not the next one's too.
        if (impl != graph_impl::whole_iteration)
            for (const plan_segment& seg : plan.segments)
                if (seg.lane == 1) CHECK(seg.call_count == 1);
        // Layer 2's gather overwrites layer 0's half, and layer 0's regather layer 2's: both are
        // ordered after the half's last reader, and each layer after its gather, eager and replayed.
        const auto v = find_order_violation(plan, program);
        CHECK_MESSAGE(!v, (v ? v->message : std::string()));
    }
    const std::string text = to_text(make_training_plan({graph_impl::ahead_of_time_per_layer, region_set{}}, 1, program), program);
    INFO(text);
    CHECK(text.find("layer1.attention layer1.mlp  [waits for layer1.hook.gather on lane 1]") != std::string::npos);
    CHECK(text.find("layer2.attention layer2.mlp  [waits for layer2.hook.gather on lane 1]") != std::string::npos);
}

TEST_CASE("one_layer_ahead goes beside the layer the pass runs before, by list order; it refuses to overwrite what that layer reads") {
    hook_pipeline hooks{
        hook<hook_phase::forward_pre, capturable, on_lane<1>, one_layer_ahead>("gather", [](forward_pre_context&) {}),
        hook<hook_phase::backward_pre, capturable, on_lane<1>, one_layer_ahead>("regather", [](backward_pre_context&) {}),
        hook<hook_phase::backward_pre, capturable>("inline", [](backward_pre_context&) {}),
    };
    char memory[5] = {};
    const tensor_ref own[3] = {{"layer0.params", &memory[0], 1}, {"layer1.params", &memory[1], 1}, {"layer2.params", &memory[2], 1}};
    const tensor_ref halves[2] = {{"full0", &memory[3], 1}, {"full1", &memory[4], 1}};
    auto issued_in = [](const training_program& program) {
        const training_plan plan = make_training_plan({graph_impl::ahead_of_time_per_layer, region_set{}}, 1, program);
        CHECK_FALSE(find_order_violation(plan, program));
        return hooks_and_attention_issued(plan, program);
    };
    // A stage that holds layers 0 and 2 only (layer 1 elsewhere): no hook for layer 1, and layer 2's
    // prefetch beside layer 0, the layer its pass runs before it.
    fake::model m;
    training_program gap = m.program("DDD", false, 1);
    for (auto& list : gap.microbatches) std::erase_if(list, [](const stage& s) { return s.layer == 1; });
    const layer_tensors apart[3] = {{{&own[0], 1}, {}}, {{&own[1], 1}, {}}, {{&own[2], 1}, {}}};
    const std::vector<std::string> issued = issued_in(with_hooks(gap, hooks, apart));
    INFO(fmt_log(issued));
    const std::vector<std::string> want = {
        "layer0.hook.gather fwd",   "layer2.hook.gather fwd",   "layer0.attention fwd", "layer2.attention fwd",
        "layer2.hook.inline bwd",   "layer2.hook.regather bwd", "layer0.hook.regather bwd", // its phase's other hooks first, then the prefetches
        "layer2.attention bwd",     "layer0.hook.inline bwd",   "layer0.attention bwd"};
    CHECK(issued == want);
    // There, layers 0 and 2 follow each other: on a double buffer (layer L into half L % 2) they
    // share a half, and prefetching layer 2 would overwrite layer 0's parameters before it reads them.
    const layer_tensors doubled[3] = {{{&halves[0], 1}, {}}, {{&halves[1], 1}, {}}, {{&halves[0], 1}, {}}};
    CHECK_THROWS_WITH_AS(with_hooks(gap, hooks, doubled),
                         "capscope::with_hooks: one_layer_ahead hook 'gather' would bring layer 2's parameters ('full0') while layer 0 runs, but "
                         "they share memory with layer 0's ('full0'), which that layer has yet to read -- fix: gather consecutive layers into "
                         "different buffers (a double buffer: layer L into half L % 2), or drop one_layer_ahead",
                         std::invalid_argument);
    // With every layer, the same double buffer is fine: consecutive layers use the other half.
    CHECK_NOTHROW(with_hooks(m.program("DDD", false, 1), hooks, doubled));
}

TEST_CASE("warmup hooks run before the first warmup step and after the last, and again after reset()") {
    fake::model m;
    auto& log = m.log;
    hook_pipeline hooks{
        on_warmup<warmup_point::before>("register", [&log](warmup_context&) { log.push_back("warmup before"); }),
        on_warmup<warmup_point::after>("pin", [&log](warmup_context&) { log.push_back("warmup after"); }),
    };
    const layer_tensors tensors[1] = {};
    // They travel with the program: nothing more to remember than with_hooks.
    runner<config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>> r(with_hooks(m.program("D", false, 1), hooks, tensors));
    auto marks = [&] {
        std::vector<std::string> out;
        for (std::size_t i = 0; i < log.size(); ++i)
            if (log[i].rfind("warmup", 0) == 0) out.push_back(log[i] + " @" + std::to_string(i));
        return out;
    };
    r.step(fake_stream); // warmup step 1 (eager)
    const std::size_t per_step = log.size() - 1;
    r.step(fake_stream); // warmup step 2 (eager), then the after hook
    CHECK(marks() == std::vector<std::string>{"warmup before @0", "warmup after @" + std::to_string(1 + 2 * per_step)});
    r.reset();
    log.clear();
    r.step(fake_stream);
    CHECK(marks() == std::vector<std::string>{"warmup before @0"});

    fake::model eager_model;
    runner<config<impl::eager, warmup_steps<0>>> eager(eager_model.program("D", false, 1));
    int before = 0, after = 0;
    hook_pipeline counted{on_warmup<warmup_point::before>("b", [&](warmup_context&) { ++before; }),
                          on_warmup<warmup_point::after>("a", [&](warmup_context&) { ++after; })};
    eager.set_warmup_hooks(counted);
    eager.step(fake_stream);
    eager.step(fake_stream);
    CHECK((before == 1 && after == 1)); // no warmup: both once, before the first step
}

TEST_CASE("warmup hooks of two pipelines are refused: one pipeline holds them") {
    fake::model m;
    hook_pipeline first{on_warmup<warmup_point::before>("a", [](warmup_context&) {})};
    hook_pipeline second{on_warmup<warmup_point::after>("b", [](warmup_context&) {})};
    const layer_tensors tensors[1] = {};
    const training_program p = with_hooks(m.program("D", false, 1), first, tensors);
    CHECK(bool(p.warmup.run));
    CHECK_THROWS_WITH_AS(with_hooks(p, second, tensors), doctest::Contains("already has the warmup hooks of another pipeline"),
                         std::invalid_argument);
}

TEST_CASE("step hooks run once per step, before and after the optimizer; a lane hook's reduction is waited for") {
    fake::model m;
    auto& log = m.log;
    char memory[4] = {};
    const tensor_ref params[2] = {{"layer0.params", &memory[0], 1}, {"layer1.params", &memory[1], 1}};
    const tensor_ref grads[2] = {{"layer0.grads", &memory[2], 1}, {"layer1.grads", &memory[3], 1}};
    const layer_tensors tensors[2] = {{{&params[0], 1}, {&grads[0], 1}}, {{&params[1], 1}, {&grads[1], 1}}};
    hook_pipeline hooks{
        on_step<step_point::after_optimizer, boundary>("log", [&log](step_context& c) {
            log.push_back("step log " + std::to_string(c.layers().size()) + " layers");
        }),
        on_step<step_point::before_optimizer, capturable>("clip", [&log](step_context& c) {
            log.push_back("clip " + std::string(c.layers()[1].gradients[0].name));
        }),
        hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("grad all-reduce", [&log](backward_context& c) {
            log.push_back(where("reduce", c));
        }),
    };
    // The eager run without the lane hook (a lane needs CUDA events); the plan with it.
    hook_pipeline step_only{hooks.at<0>(), hooks.at<1>()};
    const training_program program = with_hooks(m.program("DD", false, 2), step_only, tensors);
    REQUIRE(program.step_end.size() == 3);
    CHECK(program.step_end[0].name == "step.hook.clip");
    CHECK(program.step_end[1].name == "optimizer");
    CHECK(program.step_end[2].name == "step.hook.log");
    CHECK(program.step_end[2].synchronizes_with_host); // host work: an eager island
    CHECK(program.step_end[0].outputs == std::vector<tensor_ref>{grads[0], grads[1]}); // clipping writes the gradients

    runner<config<impl::eager>> eager(program);
    eager.step(fake_stream);
    INFO(fmt_log(log));
    const auto at = [&](const std::string& what) { return std::find(log.begin(), log.end(), what) - log.begin(); };
    CHECK(at("clip layer1.grads") < at("optimizer.fwd"));
    CHECK(at("optimizer.fwd") < at("step log 2 layers"));
    CHECK(at("step log 2 layers") == std::ptrdiff_t(log.size()) - 1);
    CHECK(at("layer0.attention.bwd") < at("clip layer1.grads"));
    CHECK(std::count(log.begin(), log.end(), "clip layer1.grads") == 1);

    // The clip reads and writes every gradient, so it waits for the last reduction on lane 1.
    const training_program laned = with_hooks(m.program("DD", false, 2), hooks, tensors);
    const training_plan plan = make_training_plan({graph_impl::ahead_of_time_per_layer, region_set{}}, 1, laned);
    const std::string text = to_text(plan, laned);
    INFO(text);
    CHECK(text.find("eager        step.hook.clip optimizer step.hook.log  [waits for layer0.hook.grad all-reduce on lane 1]") !=
          std::string::npos);
    CHECK_FALSE(find_order_violation(plan, laned));
    // Under full_iteration a capturable step hook is in the one graph.
    hook_pipeline captured{on_step<step_point::before_optimizer, capturable>("clip", [](step_context&) {})};
    const training_program whole = with_hooks(m.program("DD", false, 1), captured, tensors);
    const training_plan whole_plan = make_training_plan({graph_impl::whole_iteration, region_set{}}, 1, whole);
    CHECK(whole_plan.segments.size() == 1);
    CHECK(std::any_of(whole_plan.calls.begin(), whole_plan.calls.end(), [&](const stage_call& c) { return stage_of(whole, c).name == "step.hook.clip"; }));
}

TEST_CASE("of_layers<...> keeps a hook to the layers it names; a layer the program lacks is an error") {
    fake::model m;
    hook_pipeline hooks{
        hook<hook_phase::forward, capturable, of_layers<1, 2>>("probe", [](forward_context&) {}),
        hook<hook_phase::forward, capturable>("every", [](forward_context&) {}),
    };
    const layer_tensors tensors[3] = {};
    const training_program program = with_hooks(m.program("DDD", false, 1), hooks, tensors);
    std::vector<std::string> probes;
    for (const stage& s : program.microbatches[0])
        if (s.name.find(".hook.") != std::string::npos) probes.push_back(s.name);
    CHECK(probes == std::vector<std::string>{"layer0.hook.every", "layer1.hook.probe", "layer1.hook.every", "layer2.hook.probe",
                                             "layer2.hook.every"});
    hook_pipeline too_far{hook<hook_phase::forward, capturable, of_layers<0, 3>>("probe", [](forward_context&) {})};
    CHECK_THROWS_WITH_AS(with_hooks(m.program("DDD", false, 1), too_far, tensors),
                         doctest::Contains("hook 'probe' names layer 3 in of_layers<...>, but the program has 3 layers"), std::invalid_argument);
}

TEST_CASE("P13: given the capture scope, a capture-time hook goes next to captured stages; one left in an eager segment is refused") {
    fake::model m;
    hook_pipeline hooks{hook<hook_phase::forward, capture_time>("register", [](forward_context&) {})};
    const layer_tensors tensors[1] = {};
    // MoE layer with dropless experts, attention and moe_router captured: the layer's last stage
    // (moe_experts) is eager, so the whole-layer hook goes after moe_router, the last captured one.
    const capture_scope router{graph_impl::ahead_of_time_per_layer, region_set{capture_module::attention, capture_module::moe_router}};
    const training_program program = with_hooks(m.program("E", true, 1), hooks, tensors, &router);
    const auto& list = program.microbatches[0];
    const auto hook_at = std::find_if(list.begin(), list.end(), [](const stage& s) { return s.capture_only; });
    REQUIRE(hook_at != list.end());
    CHECK((hook_at - 1)->name == "layer0.moe_router");
    const training_plan plan = make_training_plan(router, 1, program);
    CHECK_FALSE(find_order_violation(plan, program));
    // Without the scope it sits after the layer's last stage, which no graph holds: P13, not silence.
    const training_program unscoped = with_hooks(m.program("E", true, 1), hooks, tensors);
    CHECK_THROWS_WITH_AS(make_training_plan(router, 1, unscoped),
                         doctest::Contains("capscope plan rule P13: capture-time stage 'layer0.hook.register' falls in an eager segment"),
                         plan_error);
    // Local capturing attention only: the hook goes after attention, not after the eager mlp.
    const capture_scope attention{graph_impl::lazy_per_layer, region_set{capture_module::attention}};
    const training_program dense = with_hooks(m.program("D", false, 1), hooks, tensors, &attention);
    CHECK_NOTHROW(make_training_plan(attention, 1, dense));

    // A region the config does not capture: no captured stage to go next to.
    hook_pipeline of_mlp{hook<hook_phase::forward, capture_time, of_region<capture::mlp>>("register", [](forward_context&) {})};
    const training_program mlp_hook = with_hooks(m.program("D", false, 1), of_mlp, tensors, &attention);
    CHECK_THROWS_WITH_AS(make_training_plan(attention, 1, mlp_hook),
                         doctest::Contains("capscope plan rule P13: capture-time stage 'layer0.hook.register' falls in an eager segment"),
                         plan_error);
    CHECK_NOTHROW(make_training_plan({graph_impl::lazy_per_layer, region_set{capture_module::mlp}}, 1, mlp_hook));
    CHECK_NOTHROW(make_training_plan({graph_impl::eager, region_set{}}, 1, mlp_hook)); // nothing captured, nothing asked
}
