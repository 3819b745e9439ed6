// Stream order derived from what stages touch, and the verifier that proves it
// (capscope/plan/stream_order.hpp, capscope/plan/verify.hpp): the composition bugs of issue 30
// are gone whatever the order of with_hooks and with_offload; thousands of random compositions
// (impl x regions x hooks of every phase, placement and lane x offload sets, slots, delay and
// in-flight caps x microbatches, in both composition orders) verify; and dropping any one
// derived wait makes the verifier name the two calls and the buffer.

#include "fake_program.hpp"
#include "plan_helpers.hpp"
#include "recorded_helpers.hpp"

#include <capscope/capscope.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

using namespace capscope;
using namespace plan_helpers;

namespace {

using om = offload_module;

//! `plan` without its wait `i`.
training_plan without_wait(training_plan plan, int i) {
    detail::erase_wait(plan, i);
    return plan;
}

//! A model's memory: per layer its parameters and gradients, and a ring of activation slots.
struct memory {
    std::vector<char> params = std::vector<char>(64), grads = std::vector<char>(64), ring = std::vector<char>(64 * 8),
                      own = std::vector<char>(64 * 16), host = std::vector<char>(64 * 32);
};

//! The fake dense layers keep qkv_linear (attention) and mlp_norm (made by attention, kept by the
//! MLP), at the addresses the offload plan gives them: ring slots shared by later layers.
training_program keeping(fake::model& m, memory& mem, int layers, int microbatches, const offload_plan& plan) {
    auto p = m.program(std::string(std::size_t(layers), 'D'), false, microbatches);
    auto address = [&](int layer, om module) -> char* {
        const int g = plan.group_of(layer, module);
        const bool norm = module == om::mlp_norm;
        if (g >= 0 && plan.groups[std::size_t(g)].member >= 0) return mem.ring.data() + 64 * (2 * plan.groups[std::size_t(g)].slot + (norm ? 1 : 0));
        return mem.own.data() + 64 * (2 * layer + (norm ? 1 : 0));
    };
    for (auto& list : p.microbatches)
        for (stage& s : list) {
            if (s.layer < 0) continue;
            const om module = s.kind == stage_kind::attention ? om::qkv_linear : om::mlp_norm;
            s.saves = {{module, {"layer" + std::to_string(s.layer) + "." + std::string(megatron_name(module)), address(s.layer, module), 16}, 2}};
            if (s.kind == stage_kind::attention) s.makes = {om::mlp_norm};
        }
    return p;
}

std::vector<offload_copies> copies_of(const offload_plan& plan, fake::model& m, memory& mem, const training_program& p) {
    std::vector<offload_copies> c(plan.groups.size());
    for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        m.recorders.push_back(std::make_unique<fake::recorder>(fake::recorder{&m.log, "copy" + std::to_string(g)}));
        c[g].out = stream_fn::of<&fake::recorder::forward>(m.recorders.back().get());
        c[g].back = stream_fn::of<&fake::recorder::backward>(m.recorders.back().get());
        for (const stage& s : p.microbatches[0])
            for (const saved_tensor& t : s.saves)
                if (s.layer == plan.groups[g].layer && t.module == plan.groups[g].module) c[g].device = {t.tensor};
        c[g].host = {{"host copy " + std::to_string(g), mem.host.data() + 16 * g, 16}};
    }
    return c;
}

//! Offload both module inputs the fake layers keep, whatever their size.
offload_settings both_inputs() {
    offload_settings o;
    o.enabled = true;
    o.modules = {om::qkv_linear, om::mlp_norm};
    o.min_tensor_size = 1;
    return o;
}

std::vector<offload_tensor_decl> decls(int layers) {
    std::vector<offload_tensor_decl> d;
    for (int l = 0; l < layers; ++l) {
        d.push_back({l, om::qkv_linear, "layer" + std::to_string(l) + ".qkv_linear", 16, 2});
        d.push_back({l, om::mlp_norm, "layer" + std::to_string(l) + ".mlp_norm", 16, 2});
    }
    return d;
}

std::vector<layer_tensors> tensors_of(memory& mem, std::vector<tensor_ref>& params, std::vector<tensor_ref>& grads, int layers, bool double_buffer) {
    params.clear();
    grads.clear();
    params.reserve(std::size_t(layers));
    grads.reserve(std::size_t(layers));
    std::vector<layer_tensors> t;
    for (int l = 0; l < layers; ++l) {
        params.push_back({"layer" + std::to_string(l) + ".params", mem.params.data() + 4 * (double_buffer ? l % 2 : l), 4});
        grads.push_back({"layer" + std::to_string(l) + ".grads", mem.grads.data() + 4 * l, 4});
        t.push_back({{&params.back(), 1}, {&grads.back(), 1}});
    }
    return t;
}


// Hook pipelines of every phase, placement and lane (one type each).
const auto gather = hook<hook_phase::forward_pre, capturable, on_lane<1>>("gather", [](forward_pre_context&) {});
const auto regather = hook<hook_phase::backward_pre, capturable, on_lane<1>>("regather", [](backward_pre_context&) {});
const auto reduce = hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("reduce", [](backward_context&) {});
const auto reduce_every = hook<hook_phase::backward, capturable, on_lane<7>>("reduce every", [](backward_context&) {});
const auto peek = hook<hook_phase::forward, capturable, on_lane<8>, of_region<capture::mlp>>("peek", [](forward_context&) {});
const auto log_host = hook<hook_phase::forward, boundary>("log", [](forward_context&) {});
const auto at_capture = hook<hook_phase::forward_pre, capture_time>("setup", [](forward_pre_context&) {});
const auto inline_pre = hook<hook_phase::backward_pre, capturable>("inline", [](backward_pre_context&) {});
const auto setup_on_lane = hook<hook_phase::forward_pre, capture_time, on_lane<1>>("setup on lane", [](forward_pre_context&) {});
const auto note_on_lane = hook<hook_phase::backward, capture_time, on_lane<1>>("note on lane", [](backward_context&) {});
const auto clip_step = on_step<step_point::before_optimizer, capturable, on_lane<6>>("clip", [](step_context&) {});
const auto log_step = on_step<step_point::after_optimizer, boundary>("step log", [](step_context&) {});
const auto probe_first = hook<hook_phase::backward, capturable, on_lane<5>, of_layers<0>>("probe first", [](backward_context&) {});
const auto gather_ahead = hook<hook_phase::forward_pre, capturable, on_lane<1>, one_layer_ahead>("gather ahead", [](forward_pre_context&) {});
// Between an offloaded tensor's producer (attention makes mlp_norm) and its keeper (the MLP): on
// the host, or on a side lane, either splits the two into different graphs (P11, whatever the order).
const auto after_attention_host = hook<hook_phase::forward, boundary, of_region<capture::attention>>("after attention", [](forward_context&) {});
const auto before_mlp_on_lane = hook<hook_phase::forward_pre, capturable, on_lane<8>, of_region<capture::mlp>>("before mlp", [](forward_pre_context&) {});
const auto regather_ahead = hook<hook_phase::backward_pre, capturable, on_lane<1>, one_layer_ahead>("regather ahead", [](backward_pre_context&) {});

template <class F>
void with_pipeline(int which, F&& f) {
    switch (which % 14) {
    case 0: f(hook_pipeline{gather, reduce}); break;
    case 1: f(hook_pipeline{gather, regather, reduce}); break;
    case 2: f(hook_pipeline{reduce_every, peek}); break;
    case 3: f(hook_pipeline{gather, log_host, reduce}); break;
    case 4: f(hook_pipeline{at_capture, inline_pre, peek, reduce_every}); break;
    case 5: f(hook_pipeline{gather, setup_on_lane}); break; // a capture-time call's event still orders, eagerly
    case 6: f(hook_pipeline{reduce, note_on_lane}); break;
    case 7: f(hook_pipeline{gather, reduce, clip_step}); break;    // the clip waits for the reductions
    case 8: f(hook_pipeline{reduce_every, probe_first, log_step}); break;
    case 10: f(hook_pipeline{gather_ahead, regather_ahead, reduce}); break; // prefetched into a double buffer
    case 11: f(hook_pipeline{gather_ahead, inline_pre, reduce_every}); break;
    case 12: f(hook_pipeline{gather, after_attention_host, reduce}); break;
    case 13: f(hook_pipeline{before_mlp_on_lane, reduce_every}); break;
    default: f(hook_pipeline{regather, reduce, peek}); break;
    }
}

} // namespace

TEST_CASE("the composition bugs: hooks after offload, delayed copies, a backward-only first stage, the optimizer not first") {
    fake::model m;
    memory mem;
    offload_settings o = both_inputs();
    o.delay_until_cuda_graph = true;
    const offload_plan plan = plan_offload(o, decls(4));
    const training_program p = keeping(m, mem, 4, 1, plan);
    const auto copies = copies_of(plan, m, mem, p);
    std::vector<tensor_ref> params, grads;
    const auto tensors = tensors_of(mem, params, grads, 4, true);
    const hook_pipeline hooks{gather, regather, reduce};
    using te = config<impl::ahead_of_time_per_layer, modules<>>;
    const capture_scope scope = capture_scope_of<te>;
    // Both orders: every layer's forward waits for its gather, every backward for its re-gather.
    for (const training_program& q : {with_hooks(with_offload(p, plan, copies, scope), hooks, tensors),
                                      with_offload(with_hooks(p, hooks, tensors), plan, copies, scope)}) {
        const training_plan tp = make_training_plan(scope, 1, q);
        CHECK_FALSE(find_order_violation(tp, q));
        int gathers_waited = 0, regathers_waited = 0;
        for (const derived_wait& w : tp.waits) {
            const std::string producer = stage_of(q, tp.calls[std::size_t(w.producer)]).name;
            gathers_waited += producer.find("hook.gather") != std::string::npos;
            regathers_waited += producer.find("hook.regather") != std::string::npos;
        }
        CHECK(gathers_waited == 4);
        CHECK(regathers_waited == 4);
    }
    // The optimizer waits for the reductions wherever it stands in step_end.
    training_program q = with_hooks(p, hooks, tensors);
    stage first = q.step_end.front();
    first.name = "clip";
    first.lane = 2;
    q.step_end.insert(q.step_end.begin(), first);
    const training_plan tp = make_training_plan(scope, 1, q);
    CHECK_FALSE(find_order_violation(tp, q));
    CHECK(to_text(tp, q).find("eager        optimizer  [waits for clip on lane 2]") != std::string::npos);
}

namespace {
//! Two fake layers whose forwards read what a gather on lane 1 writes.
struct gathered_layers {
    fake::model m;
    memory mem;
    std::vector<tensor_ref> params, grads;
    std::vector<layer_tensors> tensors = tensors_of(mem, params, grads, 2, false);
    hook_pipeline<std::remove_cv_t<decltype(gather)>> hooks{gather}; // the program's stages point to these
    training_program program = with_hooks(keeping(m, mem, 2, 1, plan_offload({}, decls(2))), hooks, tensors);
};
} // namespace

TEST_CASE("the model's tensors outside its layers: the optimizer waits for a step hook on a lane that touches their gradients") {
    // A global gradient-norm clip on a lane changes the embedding's gradients, which the optimizer
    // then reads; a pipeline of step hooks only needs no per-layer tensors.
    fake::model m;
    memory mem;
    training_program p = m.program("DD", false, 1);
    p.outside_layers = {{{"embedding.weight", mem.params.data() + 32, 8}}, {{"embedding.grad", mem.grads.data() + 32, 8}}};
    const hook_pipeline clip_only{clip_step};
    const training_program q = with_hooks(p, clip_only, std::span<const layer_tensors>{});
    auto clip_wait = [](const training_plan& tp, const training_program& prog) {
        for (int i = 0; i < int(tp.waits.size()); ++i) {
            const derived_wait& w = tp.waits[std::size_t(i)];
            if (w.consumer >= 0 && stage_of(prog, tp.calls[std::size_t(w.consumer)]).name == "optimizer" &&
                stage_of(prog, tp.calls[std::size_t(w.producer)]).name == "step.hook.clip")
                return i;
        }
        return -1;
    };
    for (graph_impl impl : {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration}) {
        const training_plan tp = make_training_plan({impl, {}}, 1, q);
        CHECK_FALSE(find_order_violation(tp, q));
        const int i = clip_wait(tp, q);
        REQUIRE_MESSAGE(i >= 0, to_text(tp, q));
        // The wait is what orders them: without it, the verifier names the gradient.
        const auto v = find_order_violation(without_wait(tp, i), q);
        REQUIRE(v);
        CHECK(v->buffer == "embedding.grad");
    }
    // Declared nowhere, the clip on its lane and the optimizer are ordered by nothing.
    const training_program bare = with_hooks(m.program("DD", false, 1), clip_only, std::span<const layer_tensors>{});
    CHECK(clip_wait(make_training_plan({graph_impl::eager, {}}, 1, bare), bare) < 0);
}

TEST_CASE("a stage that reads the next layer's parameters (fused across a block boundary): after that layer's gather, or P19") {
    fake::model m;
    memory mem;
    training_program p = m.program("DD", false, 1);
    for (stage& s : p.microbatches[0])
        if (s.name == "layer0.mlp") s.reads_parameters_of = {1}; // normalises with layer 1's norm weights
    std::vector<tensor_ref> params, grads;
    const auto tensors = tensors_of(mem, params, grads, 2, false);
    // Gathered on demand, layer 1's parameters arrive after layer 0 has read them.
    const hook_pipeline on_demand{gather};
    const std::string text = plan_helpers::plan_error_text({graph_impl::eager, {}}, with_hooks(p, on_demand, tensors));
    CHECK_MESSAGE(text.find("capscope plan rule P19: 'layer0.mlp' (forward) reads layer 1's parameters layer1.params (reads_parameters_of), but "
                            "no call of layer 1 has written them yet this step") == 0, text);
    CHECK(text.find("fix: gather layer 1 before 'layer0.mlp' runs: a one_layer_ahead gather hook") != std::string::npos);
    training_program beyond = with_hooks(p, on_demand, tensors);
    for (stage& s : beyond.microbatches[0])
        if (s.name == "layer0.mlp") s.reads_parameters_of = {2};
    CHECK(plan_helpers::plan_error_text({graph_impl::eager, {}}, beyond).find("capscope plan rule P3: stage 'layer0.mlp' reads the parameters of "
                                                                              "layer 2 (reads_parameters_of), which the program does not have") == 0);
    // Gathered one layer ahead, beside layer 0: the read waits for it, under every impl.
    const hook_pipeline ahead{gather_ahead};
    const training_program q = with_hooks(p, ahead, tensors);
    for (graph_impl impl : {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration}) {
        const training_plan tp = make_training_plan({impl, {}}, 1, q);
        CHECK_FALSE(find_order_violation(tp, q));
        bool waits = false;
        for (const derived_wait& w : tp.waits)
            waits = waits || (w.consumer >= 0 && stage_of(q, tp.calls[std::size_t(w.consumer)]).name.rfind("layer0.", 0) == 0 &&
                              stage_of(q, tp.calls[std::size_t(w.producer)]).name == "layer1.hook.gather ahead");
        CHECK_MESSAGE(waits, to_text(tp, q));
    }
}

TEST_CASE("capture-time hooks under impl none: no call, so no wait for what never runs") {
    fake::model m;
    memory mem;
    std::vector<tensor_ref> params, grads;
    const auto tensors = tensors_of(mem, params, grads, 2, false);
    const hook_pipeline hooks{gather, setup_on_lane, note_on_lane};
    const training_program q = with_hooks(m.program("DD", false, 1), hooks, tensors);
    const training_plan eager = make_training_plan({graph_impl::eager, {}}, 1, q);
    const std::string text = to_text(eager, q);
    CHECK_MESSAGE(text.find("setup on lane") == std::string::npos, text);
    CHECK_MESSAGE(text.find("note on lane") == std::string::npos, text);
    CHECK(text.find("layer1.hook.gather") != std::string::npos);
    // Captured, they run while their segment is captured, in their place in the stream order.
    const training_plan local = make_training_plan({graph_impl::lazy_per_layer, {}}, 1, q);
    CHECK(to_text(local, q).find("layer1.hook.setup on lane") != std::string::npos);
}

TEST_CASE("the verifier names the two calls, the buffer and the missing edge") {
    gathered_layers g;
    const training_program& q = g.program;
    const capture_scope scope{graph_impl::lazy_per_layer, {}};
    const training_plan tp = make_training_plan(scope, 1, q);
    REQUIRE(tp.waits.size() >= 1);
    const auto v = find_order_violation(without_wait(tp, 0), q);
    REQUIRE(v);
    CHECK(v->buffer == "layer0.params");
    CHECK(v->message.find("'layer0.attention' (microbatch 0, forward, lane 0) and the earlier 'layer0.hook.gather' (microbatch 0, forward, lane 1) "
                          "both touch layer0.params") == 0);
    CHECK_THROWS_WITH_AS(verify_stream_order(without_wait(tp, 0), q), doctest::Contains("capscope plan rule P12"), plan_error);
}

TEST_CASE("P19: layers that share parameter memory read their own weights, or the plan is refused naming both calls") {
    // A double buffer of gathered weights (layers 0 and 2 in one half) kept for the backward: in the
    // plan's own order, layer 0's backward would read layer 2's weights. No race: no wait mends it.
    fake::model m;
    memory mem;
    const training_program three = m.program("DDD", false, 1), two = m.program("DD", false, 1);
    std::vector<tensor_ref> params, grads, own_params, own_grads;
    const auto shared = tensors_of(mem, params, grads, 3, true);
    const capture_scope eager{graph_impl::eager, {}};
    const hook_pipeline keep{gather, reduce};
    const hook_pipeline bring_back{gather, regather, reduce};
    const std::string text = plan_helpers::plan_error_text(eager, with_hooks(three, keep, shared));
    CHECK_MESSAGE(text.find("capscope plan rule P19: 'layer0.mlp' (backward) reads layer 0's parameters layer0.params, but the last call to "
                            "write them is layer 2's 'layer2.hook.gather'") != std::string::npos, text);
    // Brought back before each backward (a re-gather): accepted, under every impl.
    for (graph_impl impl : {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration})
        CHECK(plan_helpers::plan_error_text({impl, {}}, with_hooks(three, bring_back, shared)) == "(no error)");
    // Two layers in two halves need no re-gather; memory of their own neither.
    const auto halves = std::span(shared).first(2);
    CHECK(plan_helpers::plan_error_text(eager, with_hooks(two, keep, halves)) == "(no error)");
    const auto own = tensors_of(mem, own_params, own_grads, 3, false);
    CHECK(plan_helpers::plan_error_text(eager, with_hooks(three, keep, own)) == "(no error)");
}

TEST_CASE("random compositions verify in both orders, and dropping any derived wait is caught") {
    std::mt19937 rng(30);
    auto pick = [&](int n) { return int(rng() % unsigned(n)); };
    const graph_impl impls[] = {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration};
    const region_set region_choices[] = {{}, {capture_module::attention}, {capture_module::attention, capture_module::mlp}, {capture_module::mlp}};
    int verified = 0, refused = 0, waits = 0, mutations = 0, caught = 0;
    for (int trial = 0; trial < 1500; ++trial) {
        fake::model m;
        memory mem;
        const int layers = 1 + pick(4), microbatches = 1 + pick(3);
        offload_settings o;
        o.enabled = pick(3) != 0;
        const om sets[3][2] = {{om::qkv_linear, om::qkv_linear}, {om::mlp_norm, om::mlp_norm}, {om::qkv_linear, om::mlp_norm}};
        const auto& set = sets[pick(3)];
        o.modules = {set[0], set[1]};
        o.min_tensor_size = 1;
        o.fraction = pick(2) ? 1.0 : 0.5;
        o.delay_until_cuda_graph = pick(2);
        if (pick(2)) o.max_inflight = pick(2);
        const offload_ring ring{1 + pick(3), 2};
        const offload_plan plan = plan_offload(o, decls(layers), ring);
        const training_program p = keeping(m, mem, layers, microbatches, plan);
        const auto copies = copies_of(plan, m, mem, p);
        std::vector<tensor_ref> params, grads;
        const auto tensors = tensors_of(mem, params, grads, layers, pick(2));
        const capture_scope scope{impls[pick(4)], region_choices[pick(4)]};
        with_pipeline(pick(14), [&](const auto& hooks) {
            std::string verdict[2]; // per order: the rule that refused it, or "accepted"
            for (int order = 0; order < 2; ++order) {
                training_program q;
                training_plan tp;
                try {
                    q = order ? with_offload(with_hooks(p, hooks, tensors), plan, copies, scope)
                              : with_hooks(with_offload(p, plan, copies, scope), hooks, tensors);
                    tp = make_training_plan(scope, 1, q); // verifies (tests build without NDEBUG)
                    verdict[order] = "accepted";
                } catch (const plan_error& e) {
                    ++refused; // P1 (a boundary hook in a captured region), P11 (a copy across graphs), ...
                    verdict[order] = e.rule();
                    if (order == 1) CHECK_MESSAGE(verdict[0] == verdict[1], "hooks after the copies: " << verdict[0] << ", before: " << verdict[1]);
                    continue;
                }
                if (order == 1) CHECK_MESSAGE(verdict[0] == verdict[1], "hooks after the copies: " << verdict[0] << ", before: " << verdict[1]);
                const auto v = find_order_violation(tp, q);
                CHECK_MESSAGE(!v, (v ? v->message : std::string()));
                ++verified;
                // The verifier checks what a hook declares; every hook's context exposes its layer's
                // parameters (a trust ratio in a backward hook reads them), so what it declares must
                // cover them, or a body that reads them races and still verifies.
                for (const auto& list : q.microbatches)
                    for (const stage& s : list) {
                        // An in-flight limit holds back the compute (lane 0 here), never a hook's lane.
                        if (s.name.ends_with("wait_inflight")) CHECK_MESSAGE(s.lane == 0, s.name << " is on lane " << s.lane);
                        if (s.kind != stage_kind_id("hook") || s.layer < 0) continue;
                        const call_access a = access_of(s, s.forward ? phase::forward : phase::backward, step_part::microbatch, q);
                        for (const tensor_ref& t : tensors[std::size_t(s.layer)].parameters) {
                            const bool declared = std::find(a.reads.begin(), a.reads.end(), t) != a.reads.end() ||
                                                  std::find(a.writes.begin(), a.writes.end(), t) != a.writes.end();
                            CHECK_MESSAGE(declared, "hook stage '" << s.name << "' can read " << t.name << " through its context but does not declare it");
                        }
                    }
                waits += int(tp.waits.size());
                if (trial % 5) continue; // mutate every fifth composition: each of its waits, one at a time
                for (int i = 0; i < int(tp.waits.size()); ++i) {
                    ++mutations;
                    const bool found = bool(find_order_violation(without_wait(tp, i), q));
                    caught += found;
                    CHECK_MESSAGE(found, "dropping wait " << i << " went unseen in\n" << to_text(tp, q));
                }
            }
        });
    }
    MESSAGE(verified << " plans verified (" << refused << " compositions refused by a plan rule), " << waits << " derived waits; " << caught << " of "
                     << mutations << " dropped waits caught");
    CHECK(verified > 2000);
    CHECK(mutations > 300);
    CHECK(caught == mutations);
}

TEST_CASE("a recorded program and the same program declared: the same verdict and plan text, for random compositions") {
    // An in-place trainer's marks (capscope/run/in_place_runner.hpp) become the program a declared
    // trainer builds; everything after that must not tell them apart.
    std::mt19937 rng(47);
    auto pick = [&](int n) { return int(rng() % unsigned(n)); };
    const graph_impl impls[] = {graph_impl::eager, graph_impl::lazy_per_layer, graph_impl::ahead_of_time_per_layer, graph_impl::whole_iteration};
    const region_set region_choices[] = {{}, {capture_module::attention}, {capture_module::attention, capture_module::mlp}, {capture_module::mlp}};
    int same = 0, refused = 0;
    for (int trial = 0; trial < 400; ++trial) {
        fake::model m;
        memory mem;
        const int layers = 1 + pick(4), microbatches = 1 + pick(3);
        offload_settings o = both_inputs();
        o.enabled = pick(2) != 0;
        o.delay_until_cuda_graph = pick(2);
        const offload_plan plan = plan_offload(o, decls(layers), offload_ring{1 + pick(3), 2});
        training_program declared = keeping(m, mem, layers, microbatches, plan);
        if (pick(3) == 0) { // a fused kernel across a block boundary, and a backward-only stage of the trainer's own
            for (auto& list : declared.microbatches)
                for (stage& s : list)
                    if (s.layer >= 0 && s.layer + 1 < layers && s.kind == stage_kind::mlp) s.reads_parameters_of = {s.layer + 1};
            for (auto& list : declared.microbatches) {
                stage reduce = list[1];
                reduce.name = "layer0.own_reduce";
                reduce.kind = stage_kind_id("own_reduce");
                reduce.captured_by = region_set{"own_reduce"};
                reduce.forward = {};
                reduce.inputs.clear();
                reduce.outputs.clear();
                reduce.backward_outputs = {{"layer0.reduced", m.buffers.data() + 30, 1}};
                reduce.saves.clear();
                reduce.makes = offload_name_set{};
                list.insert(list.begin() + 1, reduce);
            }
        }
        const auto copies = copies_of(plan, m, mem, declared);
        std::vector<tensor_ref> params, grads;
        const auto tensors = tensors_of(mem, params, grads, layers, pick(2));
        declared.layers.clear();
        for (const layer_tensors& t : tensors) declared.layers.push_back({{t.parameters.begin(), t.parameters.end()}, {t.gradients.begin(), t.gradients.end()}});
        const training_program record = recorded_helpers::recorded(declared);
        const capture_scope scope{impls[pick(4)], region_choices[pick(4)]};
        with_pipeline(pick(14), [&](const auto& hooks) {
            std::string verdict[2], text[2];
            const training_program* programs[] = {&declared, &record};
            for (int k = 0; k < 2; ++k) {
                try {
                    const training_program q = with_hooks(with_offload(*programs[k], plan, copies, scope), hooks, tensors, &scope);
                    const training_plan tp = make_training_plan(scope, 1, q);
                    verdict[k] = find_order_violation(tp, q) ? "P12" : "accepted";
                    text[k] = to_text(tp, q);
                } catch (const plan_error& e) {
                    verdict[k] = std::string(e.rule()) + ": " + e.what();
                }
            }
            CHECK_MESSAGE(verdict[0] == verdict[1], "declared: " << verdict[0] << "\nrecorded: " << verdict[1]);
            CHECK_MESSAGE(text[0] == text[1], "declared:\n" << text[0] << "\nrecorded:\n" << text[1]);
            same += verdict[0] == verdict[1] && text[0] == text[1];
            refused += verdict[0] != "accepted";
        });
    }
    MESSAGE(same << " of 400 compositions alike recorded and declared (" << refused << " refused by a plan rule, alike)");
    CHECK(same == 400);
    CHECK(refused > 10);
    CHECK(refused < 390);
}

TEST_CASE("a hook on a lane whose layer_tensors name nothing it touches is refused: nothing could wait for it") {
    fake::model m;
    const layer_tensors nothing[2] = {};
    const hook_pipeline gathers{gather};
    const hook_pipeline inline_pres{inline_pre};
    CHECK_THROWS_WITH_AS(with_hooks(m.program("DD", false, 1), gathers, nothing),
                         doctest::Contains("hook 'gather' runs on lane 1 but layer 0's layer_tensors name nothing it touches (no parameters)"),
                         std::invalid_argument);
    // On the layer's own stream it needs nothing: the stream orders it.
    CHECK_NOTHROW(with_hooks(m.program("DD", false, 1), inline_pres, nothing));
    // One layer_tensors per layer, no fewer and no more.
    const layer_tensors three[3] = {};
    CHECK_THROWS_WITH_AS(with_hooks(m.program("DD", false, 1), inline_pres, three),
                         doctest::Contains("3 layer_tensors for a program of 2 layers"), std::invalid_argument);
}

TEST_CASE("the verifier refuses an event recorded inside one graph and waited for outside it") {
    // The gathers are graphs of their own on lane 1; the layers wait for the graphs' ends.
    gathered_layers g;
    const training_program& q = g.program;
    training_plan tp = make_training_plan({graph_impl::ahead_of_time_per_layer, {}}, 1, q);
    REQUIRE(!tp.waits.empty());
    // Move the first wait onto an event recorded by the gather call inside its graph: eagerly that
    // orders the same, replayed no stream outside the graph can see it.
    derived_wait& w = tp.waits.front();
    tp.calls[std::size_t(w.producer)].record = int(tp.events.size());
    tp.events.push_back({w.producer, -1});
    w.event = tp.calls[std::size_t(w.producer)].record;
    CHECK_FALSE(detail::first_violation(tp, q, false));
    const auto v = detail::first_violation(tp, q, true);
    REQUIRE(v);
    CHECK(v->message.find("which is recorded inside another graph or outside this one (replayed)") != std::string::npos);
}

namespace {
//! An activation store's stand-in on the host: the plan and copies, placed for a scope.
struct host_store {
    const offload_plan* the_plan;
    const std::vector<offload_copies>* copies;
    const offload_plan& plan() const { return *the_plan; }
    training_program with_offload(const training_program& p, const capture_scope& c) const { return capscope::with_offload(p, *the_plan, *copies, c); }
};
} // namespace

TEST_CASE("composition: one declaration, any order of its parts, the same program; it owns the hooks and buffers it keeps") {
    fake::model m;
    memory mem;
    const offload_plan plan = plan_offload(both_inputs(), decls(4));
    const training_program p = keeping(m, mem, 4, 2, plan);
    const auto copies = copies_of(plan, m, mem, p);
    const host_store store{&plan, &copies};
    using te = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>;
    std::vector<std::string> log;
    auto layers = [&] { // the buffers, as values: the composition keeps its own copy
        std::vector<layer_buffers> out;
        for (int l = 0; l < 4; ++l)
            out.push_back({{{"layer" + std::to_string(l) + ".params", mem.params.data() + 4 * l, 4}},
                           {{"layer" + std::to_string(l) + ".grads", mem.grads.data() + 4 * l, 4}}});
        return out;
    };
    auto pipeline = [&] {
        return hook_pipeline{hook<hook_phase::forward_pre, capturable, on_lane<1>>("gather", [&log](forward_pre_context& c) {
                                 log.push_back("gather " + std::to_string(c.layer()) + " " + c.parameters().front().name);
                             }),
                             reduce};
    };
    // Named in two orders, from temporaries that are gone when the program runs.
    const training_program a = composition<te>(p).hooks(pipeline(), layers()).offload(store).sharded<sharded<>>().program();
    const training_program b = composition<te>(p).offload(store).sharded<sharded<>>().hooks(pipeline(), layers()).program();
    const training_plan pa = make_training_plan(capture_scope_of<te>, 1, a), pb = make_training_plan(capture_scope_of<te>, 1, b);
    CHECK(to_text(pa, a) == to_text(pb, b));
    CHECK(to_text(pa, a).find("[waits for layer2.hook.gather on lane 1]") != std::string::npos);
    // The same as the untyped steps in that order; in the other, a backward hook and a copy back
    // that sit at one place run in the other order (both plans verify).
    std::vector<layer_tensors> tensors;
    const auto held = layers();
    for (const auto& l : held) tensors.push_back({l.parameters, l.gradients});
    const auto hooks = pipeline();
    const training_program c = with_hooks(with_offload(p, plan, copies, capture_scope_of<te>), hooks, tensors);
    CHECK(to_text(make_training_plan(capture_scope_of<te>, 1, c), c) == to_text(pa, a));
    const training_program d = with_offload(with_hooks(p, hooks, tensors), plan, copies, capture_scope_of<te>);
    CHECK_NOTHROW(make_training_plan(capture_scope_of<te>, 1, d));
    // The hooks run from the program's own copy of the pipeline and buffers.
    run_forward(a.microbatches[0], nullptr);
    CHECK(log == std::vector<std::string>{"gather 0 layer0.params", "gather 1 layer1.params", "gather 2 layer2.params", "gather 3 layer3.params"});
    CHECK(a.keepalive.size() == 1);
    // A side-lane hook between attention (which makes mlp_norm) and the MLP (which keeps it) splits
    // the two into different graphs: the plan refuses it (P11) whatever the order of the parts.
    const hook_pipeline splitting{before_mlp_on_lane};
    for (const training_program& q : {composition<te>(p).offload(store).hooks(splitting, layers()).program(),
                                      composition<te>(p).hooks(splitting, layers()).offload(store).program()})
        CHECK(plan_helpers::plan_error_text(capture_scope_of<te>, q).starts_with("capscope plan rule P11: offloaded tensor mlp_norm of layer 0 "
                                                                                "is written by stage 'layer0.attention' (captured) and kept"));
    // Hooks named twice do not compile (composition rule C1, tests/compile_fail/hook_cases.cpp).
    // A hook on a lane the copies use (2..3 here) is refused where the two are named together.
    const hook_pipeline on_copy_lane{hook<hook_phase::backward, capturable, on_lane<3>>("reduce", [](backward_context&) {})};
    CHECK_THROWS_WITH_AS(composition<te>(p).offload(store).hooks(on_copy_lane, layers()).program(),
                         doctest::Contains("a hook runs on lane 3, which the activation copies use (lanes 2..3)"), std::invalid_argument);
}

TEST_CASE("a hooked, offloaded program still matches its layer schemas: what capscope adds is passed over") {
    using dense = layer_schema<"dense", stage_decl<stage_kind::attention, regions<capture::attention>, saves<om::qkv_linear>, makes<om::mlp_norm>>,
                               stage_decl<stage_kind::mlp, regions<capture::mlp>, saves<om::mlp_norm>>>;
    fake::model m;
    memory mem;
    const offload_plan plan = plan_offload(both_inputs(), decls(4));
    const training_program p = keeping(m, mem, 4, 1, plan);
    const auto copies = copies_of(plan, m, mem, p);
    std::vector<tensor_ref> params, grads;
    const auto tensors = tensors_of(mem, params, grads, 4, false);
    const hook_pipeline hooks{gather, regather, reduce, log_host};
    using te = config<impl::ahead_of_time_per_layer, modules<>>;
    const training_program q = with_hooks(with_offload(p, plan, copies, capture_scope_of<te>), hooks, tensors);
    CHECK_NOTHROW(match_schemas(layer_schemas<dense>{}, q));
}
