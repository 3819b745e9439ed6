#pragma once
//! @file
//! The plan of a training step (pure host): from a capture scope and a `training_program`,
//! every stage call of one step in execution order, grouped into segments (graphs and eager
//! islands), with graphs numbered in the order an ahead-of-time runner captures them: forward
//! in layer order, backward in reverse, microbatch after microbatch; and the stream order
//! between them, derived from what the calls touch (capscope/plan/stream_order.hpp) and
//! verified (capscope/plan/verify.hpp). A graphed segment of a
//! later microbatch whose stages all declare their buffers, bound exactly as in microbatch 0,
//! reuses that graph; otherwise it gets its own, and the plan says which stage kept it apart.
//! Everything that cannot work is found here, before any capture (`plan_error`).

#include <capscope/detail/breakage.hpp>
#include <capscope/plan/capture_region.hpp>
#include <capscope/plan/guards.hpp>
#include <capscope/plan/offload_placement.hpp>
#include <capscope/plan/plan_calls.hpp>
#include <capscope/plan/plan_error.hpp>
#include <capscope/plan/stream_order.hpp>
#include <capscope/plan/verify.hpp>
#include <capscope/stage/program.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

namespace capscope {

namespace detail {

inline std::vector<stage_facts> facts_of(const std::vector<stage>& list) {
    std::vector<stage_facts> out;
    out.reserve(list.size());
    for (const stage& s : list) out.push_back(s.facts());
    return out;
}

//! A declared buffer orders work only if it covers memory: one with no address, no bytes, or an
//! end past the address space (SIZE_MAX meant as "the whole arena") overlaps nothing, so the plan
//! would derive no wait from it, silently. Refused, naming the stage and the buffer (a layer's
//! parameters or gradients may be empty: a layer without them).
inline void check_declared_buffers(const training_program& p) {
    // `empty_allowed`: a layer without parameters or gradients declares an empty tensor; a stage's
    // own buffer of 0 bytes is a size left out (tensor_ref{"G", ptr} meant as the whole of G).
    auto check = [](const tensor_ref& t, const std::string& who, const char* as, bool empty_allowed = false) {
        if (empty_allowed && t.bytes == 0) return;
        const char* wrong = !t.data ? "has no address" : t.bytes == 0 ? "has 0 bytes"
                          : std::uintptr_t(t.data) + t.bytes < std::uintptr_t(t.data) ? "ends past the address space" : nullptr;
        if (wrong)
            throw plan_error("P3", who,
                             who + " declares buffer '" + name_of(t) + "' (" + as + "), which " + wrong +
                                 ", so it would order nothing against the other streams",
                             "declare the buffer's device address and its size in bytes (tensor_ref{name, data, bytes}); a stage that "
                             "touches memory it cannot name leaves buffers_declared false and is ordered against all other work");
    };
    auto check_stage = [&](const stage& s) {
        const std::string who = "stage '" + s.name + "'";
        if (s.guard && s.guard.predicate.data) check(s.guard.predicate, who, "its guard's flag"); // no flag at all: P15 says so
        if (!s.buffers_declared) return;
        for (const tensor_ref& t : s.inputs) check(t, who, "an input");
        for (const tensor_ref& t : s.outputs) check(t, who, "an output");
        for (const tensor_ref& t : s.backward_inputs) check(t, who, "a backward input");
        for (const tensor_ref& t : s.backward_outputs) check(t, who, "a backward output");
        for (const saved_tensor& t : s.saves) check(t.tensor, who, "a saved tensor");
    };
    for (const auto& list : p.microbatches)
        for (const stage& s : list) check_stage(s);
    for (const stage& s : p.step_begin) check_stage(s);
    for (const stage& s : p.step_end) check_stage(s);
    for (std::size_t l = 0; l < p.layers.size(); ++l) {
        const std::string who = "training_program::layers[" + std::to_string(l) + "]";
        for (const tensor_ref& t : p.layers[l].parameters) check(t, who, "a parameter", true);
        for (const tensor_ref& t : p.layers[l].gradients) check(t, who, "a gradient", true);
    }
}

inline void check_program_shape(const training_program& p) {
    if (p.microbatches.empty())
        throw plan_error("P3", "", "the training program has no microbatch", "give training_program::microbatches one stage list per microbatch");
    for (std::size_t mb = 0; mb < p.microbatches.size(); ++mb) {
        const auto& list = p.microbatches[mb];
        const auto& first = p.microbatches[0];
        if (list.empty())
            throw plan_error("P3", "", "microbatch " + std::to_string(mb) + " has no stages", "give every microbatch its stage list");
        if (list.size() != first.size())
            throw plan_error("P3", "", "microbatch " + std::to_string(mb) + " has " + std::to_string(list.size()) + " stages, microbatch 0 has " +
                                           std::to_string(first.size()),
                             "every microbatch runs the same stages (only their buffers may differ)");
        for (std::size_t i = 0; i < list.size(); ++i)
            if (!(list[i].facts() == first[i].facts()))
                throw plan_error("P3", list[i].name,
                                 "stage " + std::to_string(i) + " of microbatch " + std::to_string(mb) + " ('" + list[i].name +
                                     "') differs from microbatch 0's ('" + first[i].name + "') in kind, layer, regions or capture facts",
                                 "every microbatch runs the same stages (only their buffers may differ)");
    }
    auto check_fns = [&](const std::vector<stage>& list, bool step_level) {
        for (const stage& s : list) {
            if (step_level && !s.forward)
                throw plan_error("P3", s.name, "step-level stage '" + s.name + "' has no forward function",
                                 "bind stage::forward (step_begin and step_end run forwards only)");
            if (!s.forward && !s.backward)
                throw plan_error("P3", s.name, "stage '" + s.name + "' has neither a forward nor a backward function",
                                 "bind stage::forward, stage::backward or both");
            if (s.lane < 0 || s.lane > max_lanes)
                throw plan_error("P3", s.name, "stage '" + s.name + "' is on lane " + std::to_string(s.lane) + ", outside 0.." + std::to_string(max_lanes),
                                 "use lane 0 (the step's stream) or a side lane 1.." + std::to_string(max_lanes));
            for (int other : s.reads_parameters_of)
                if (other < 0 || (!p.layers.empty() && std::size_t(other) >= p.layers.size()))
                    throw plan_error("P3", s.name, "stage '" + s.name + "' reads the parameters of layer " + std::to_string(other) +
                                     " (reads_parameters_of), which the program does not have",
                                     "name layers 0.." + std::to_string(int(p.layers.size()) - 1));
            // A branch is forked from the segment around it onto its own lane: the step's stream is no
            // lane to fork onto (inside a side-lane segment the runner could not place it at all).
            if (s.branch && s.lane == 0)
                throw plan_error("P3", s.name, "branch stage '" + s.name + "' is on lane 0, the step's stream, but a branch is forked onto a side lane "
                                 "from the segment around it and joined at that segment's end",
                                 "put the branch on a side lane 1.." + std::to_string(max_lanes) + ", or make it an ordinary stage (branch = false)");
        }
    };
    for (const auto& list : p.microbatches) check_fns(list, false);
    check_fns(p.step_begin, true);
    check_fns(p.step_end, true);
    check_declared_buffers(p);
}

//! Broken on purpose, for the tests that must go red without a derived wait (detail::breakage):
//! drops every wait for calls of stages whose name contains `producer`, and says on stderr what
//! the verifier finds.
inline void drop_waits_from(training_plan& plan, const training_program& program, const std::string& producer) {
    int dropped = 0;
    for (int i = int(plan.waits.size()) - 1; i >= 0; --i)
        if (stage_of(program, plan.calls[std::size_t(plan.waits[std::size_t(i)].producer)]).name.find(producer) != std::string::npos) {
            erase_wait(plan, i);
            ++dropped;
        }
    const auto v = find_order_violation(plan, program);
    std::fprintf(stderr, "capscope, broken on purpose: dropped %d waits for '%s'; the verifier: %s\n", dropped, producer.c_str(),
                 v ? ("P12: " + v->message).c_str() : "no violation found");
}

//! P19: a call that reads layer L's parameters must find there what layer L's own writer (its
//! gather hook) put last. Where layers' parameters share memory (gathered weights in a double
//! buffer), the layers' writers take turns; in the order the plan issues its calls, a read of
//! layer L's parameters after layer M's writer overwrote them gets layer M's weights. No wait can
//! mend that: the reads are ordered, just wrong (a sharded policy that keeps gathered weights for
//! the backward in a double buffer, with three layers or more).
inline void check_parameter_owners(const training_plan& plan, const training_program& program) {
    const auto& layers = program.layers;
    bool shared = false; // only layers whose parameters overlap can take each other's
    for (std::size_t l = 0; l < layers.size() && !shared; ++l)
        for (std::size_t m = l + 1; m < layers.size() && !shared; ++m)
            for (const tensor_ref& p : layers[l].parameters)
                for (const tensor_ref& q : layers[m].parameters) shared = shared || overlaps(p, q);
    // ... or a stage that reads another layer's (reads_parameters_of): before that layer's writer?
    bool across = false;
    for (const auto& list : program.microbatches)
        for (const stage& s : list) across = across || !s.reads_parameters_of.empty();
    if (!shared && !across) return;
    // Per layer and parameter tensor: the layer whose writer wrote it last this step, and that call (-1: none known).
    struct last_write {
        int layer = -1, call = -1;
    };
    std::vector<std::vector<last_write>> last(layers.size());
    for (std::size_t l = 0; l < layers.size(); ++l) last[l].resize(layers[l].parameters.size());
    // The layers whose parameters a call of their own writes in the step (a gather hook): read
    // before that call, they hold what an earlier step or another layer left there.
    std::vector<char> written_by_own(layers.size(), 0);
    for (const stage_call& call : plan.calls) {
        const stage& s = stage_of(program, call);
        if (call.part != step_part::microbatch || s.layer < 0 || std::size_t(s.layer) >= layers.size()) continue;
        const call_access a = access_of(s, call.direction, call.part, program);
        for (const tensor_ref& t : a.writes)
            for (const tensor_ref& p : layers[std::size_t(s.layer)].parameters)
                if (overlaps(t, p)) written_by_own[std::size_t(s.layer)] = 1;
    }
    for (std::size_t c = 0; c < plan.calls.size(); ++c) {
        const stage_call& call = plan.calls[c];
        const stage& s = stage_of(program, call);
        const call_access a = access_of(s, call.direction, call.part, program);
        // An undeclared stage may read or write anything: it is neither checked nor counted (the
        // layer's declared readers, its hooks among them, still are).
        if (a.everything) continue;
        const bool of_a_layer = call.part == step_part::microbatch && s.layer >= 0 && std::size_t(s.layer) < layers.size();
        if (of_a_layer)
            for (std::size_t i = 0; i < layers[std::size_t(s.layer)].parameters.size(); ++i) {
                const tensor_ref& mine = layers[std::size_t(s.layer)].parameters[i];
                const last_write& w = last[std::size_t(s.layer)][i];
                if (w.layer < 0 || w.layer == s.layer || std::find(a.reads.begin(), a.reads.end(), mine) == a.reads.end()) continue;
                const stage& writer = stage_of(program, plan.calls[std::size_t(w.call)]);
                throw plan_error("P19", s.name,
                                 "'" + s.name + "' (" + std::string(phase_name(call.direction)) + ") reads layer " + std::to_string(s.layer) +
                                     "'s parameters " + name_of(mine) + ", but the last call to write them is layer " + std::to_string(w.layer) +
                                     "'s '" + writer.name + "': the layers share that memory, so it would compute with layer " +
                                     std::to_string(w.layer) + "'s weights",
                                 "bring layer " + std::to_string(s.layer) + "'s parameters back before it reads them (sharded<..., "
                                 "regather_for_backward>: a backward_pre gather), or give the layers memory of their own (persistent_buffer); "
                                 "a stage of your own that brings them back declares it writes them (buffers_declared); layers that share "
                                 "weights on purpose declare the shared tensor for one layer only");
            }
        // Another layer's parameters, read where that layer's own writer has not put them last.
        if (of_a_layer)
            for (int other : s.reads_parameters_of) {
                if (other < 0 || std::size_t(other) >= layers.size() || other == s.layer || !written_by_own[std::size_t(other)]) continue;
                for (std::size_t i = 0; i < layers[std::size_t(other)].parameters.size(); ++i) {
                    const last_write& w = last[std::size_t(other)][i];
                    if (w.layer == other) continue;
                    const std::string by = w.layer < 0 ? std::string("no call of layer ") + std::to_string(other) + " has written them yet this step"
                                                       : "the last call to write them is layer " + std::to_string(w.layer) + "'s '" +
                                                             stage_of(program, plan.calls[std::size_t(w.call)]).name + "'";
                    throw plan_error("P19", s.name,
                                     "'" + s.name + "' (" + std::string(phase_name(call.direction)) + ") reads layer " + std::to_string(other) +
                                         "'s parameters " + name_of(layers[std::size_t(other)].parameters[i]) +
                                         " (reads_parameters_of), but " + by + ", so it would compute with stale or another layer's weights",
                                     "gather layer " + std::to_string(other) + " before '" + s.name + "' runs: a one_layer_ahead gather "
                                     "hook brings layer L + 1's parameters beside layer L, and the plan orders the read after it");
                }
            }
        for (const tensor_ref& t : a.writes)
            for (std::size_t l = 0; l < layers.size(); ++l)
                for (std::size_t i = 0; i < layers[l].parameters.size(); ++i)
                    if (overlaps(t, layers[l].parameters[i])) last[l][i] = of_a_layer ? last_write{s.layer, int(c)} : last_write{};
    }
}

//! P13: a capture-time call (a `capture_time` hook) runs only while its segment is captured, so
//! one in an eager segment of a capturing impl would never run, silently.
inline void check_capture_time_calls(const training_plan& plan, const training_program& program) {
    if (plan.scope.impl == graph_impl::eager) return; // nothing is captured: capture-time work is not asked for
    for (const plan_segment& seg : plan.segments) {
        if (seg.graphed) continue;
        for (int k = 0; k < seg.call_count; ++k) {
            const stage& s = stage_of(program, plan.calls[std::size_t(seg.first_call + k)]);
            if (!s.capture_only) continue;
            throw plan_error("P13", s.name,
                             "capture-time stage '" + s.name + "' falls in an eager segment under impl " + std::string(megatron_name(plan.scope.impl)) +
                                 " (" + (s.layer < 0 ? std::string("outside the layers") : "layer " + std::to_string(s.layer) + "'s stages there are not captured") +
                                 "), so it would never run",
                             "pass the runner's capture scope to with_hooks (with_hooks(p, hooks, tensors, &capture_scope_of<Config>), "
                             "as composition<Config> does), so capture-time hooks go next to the stages it captures; or attach the "
                             "hook to a captured region (of_region<R> with R among the captured modules/regions), capture the stages "
                             "it hooks, or make it a capturable or boundary hook");
        }
    }
}

//! P21: a stage updated in the graph is recorded again, alone, before each replay and put in
//! place of its nodes: it cannot sit in a conditional node's body (its guard).
inline void check_updated_in_graph(const training_program& program) {
    auto check = [](const stage& s) {
        if (!s.updated_in_graph || !s.guard) return;
        throw plan_error("P21", s.name,
                         "stage '" + s.name + "' is updated in the graph before each replay and runs only while a flag holds (" +
                             guard_word(s.guard.kind) + " '" + s.guard.predicate.name + "'): a conditional node's body cannot take a "
                             "stage recorded again on its own",
                         "leave the guard off this stage, or keep the values in device memory and drop updated_in_graph (a "
                         "guarded stage may read them there)");
    };
    for (const stage& s : program.step_begin) check(s);
    for (const auto& list : program.microbatches)
        for (const stage& s : list) check(s);
    for (const stage& s : program.step_end) check(s);
}

inline void check_capturable(const capture_scope& c, const std::vector<stage>& list) {
    const auto facts = facts_of(list);
    const misplacement m = find_misplacement(c, facts);
    if (m.found()) throw_misplacement(c, facts[std::size_t(m.stage)], m.problem, list[std::size_t(m.stage)].name);
}

} // namespace detail

//! Plans one training step; throws `plan_error` when the program cannot run under `scope`.
inline training_plan make_training_plan(const capture_scope& scope, int warmup_steps, const training_program& program) {
    detail::check_program_shape(program);
    detail::check_updated_in_graph(program);
    detail::check_capturable(scope, program.step_begin);
    for (const auto& list : program.microbatches) detail::check_capturable(scope, list);
    detail::check_capturable(scope, program.step_end);
    detail::check_selection(scope, detail::facts_of(program.microbatches.front()));
    // P11 on the final lists, whatever was added after the copies (a boundary or side-lane hook
    // between an offloaded tensor's producer and its keeper splits them into two graphs).
    if (!program.offloaded.empty())
        for (const auto& list : program.microbatches) check_offload_placement(scope, program.offloaded, detail::facts_of(list), list);

    training_plan plan;
    plan.scope = scope;
    plan.warmup_steps = warmup_steps;
    plan.microbatches = static_cast<int>(program.microbatches.size());

    // Microbatch 0's graphed segments, by direction and first stage (the lists are alike, P3),
    // to share with the same segments of later microbatches.
    std::vector<int> first_microbatch_segments[2];
    for (auto& v : first_microbatch_segments) v.assign(program.microbatches.front().size(), -1);

    auto add_list = [&](step_part part, int mb, phase dir) {
        const auto& list = stage_list(program, part, mb);
        const auto facts = detail::facts_of(list);
        std::vector<stage_range> ranges;
        split_segments(scope, facts, [&](stage_range r) { ranges.push_back(r); });
        if (dir == phase::backward) std::reverse(ranges.begin(), ranges.end());
        for (const stage_range& r : ranges) {
            plan_segment seg;
            seg.part = part;
            seg.microbatch = mb;
            seg.direction = dir;
            seg.layer = facts[std::size_t(r.first)].layer;
            seg.first_call = static_cast<int>(plan.calls.size());
            seg.lane = facts[std::size_t(r.first)].lane;
            for (int k = 0; k < r.count; ++k) {
                const int i = dir == phase::forward ? r.first + k : r.first + r.count - 1 - k;
                const stage& st = list[std::size_t(i)];
                if (!(dir == phase::forward ? st.forward : st.backward)) continue;
                if (st.last_microbatch_only && part == step_part::microbatch && mb + 1 != plan.microbatches) continue;
                if (st.first_microbatch_only && part == step_part::microbatch &&
                    mb != (detail::installed_breakage().first_microbatch_as_last ? plan.microbatches - 1 : 0)) // (a test, broken on purpose)
                    continue;
                if (st.capture_only && scope.impl == graph_impl::eager) continue; // nothing is captured: it never runs, and orders nothing
                plan.calls.push_back({part, mb, i, dir, {}, -1});
            }
            seg.call_count = static_cast<int>(plan.calls.size()) - seg.first_call;
            if (seg.call_count == 0) continue;
            seg.graphed = r.graphed && scope.impl != graph_impl::whole_iteration;
            if (seg.graphed) {
                int* twin_at = part == step_part::microbatch ? &first_microbatch_segments[dir == phase::forward ? 0 : 1][std::size_t(r.first)] : nullptr;
                if (twin_at && mb > 0 && *twin_at >= 0) {
                    const plan_segment& twin = plan.segments[std::size_t(*twin_at)];
                    bool same = twin.call_count == seg.call_count;
                    for (int k = 0; same && k < seg.call_count; ++k) {
                        const stage& a = stage_of(program, plan.calls[std::size_t(twin.first_call + k)]);
                        const stage& b = stage_of(program, plan.calls[std::size_t(seg.first_call + k)]);
                        same = a.same_binding(b);
                        if (!same && (!a.buffers_declared || !b.buffers_declared)) seg.undeclared_call = seg.first_call + k;
                    }
                    seg.graph = same ? twin.graph : plan.graph_count++;
                    seg.shared = same;
                } else {
                    seg.graph = plan.graph_count++;
                    if (twin_at && mb == 0) *twin_at = static_cast<int>(plan.segments.size());
                }
            }
            plan.segments.push_back(seg);
        }
    };

    add_list(step_part::step_begin, -1, phase::forward);
    for (int mb = 0; mb < plan.microbatches; ++mb) {
        add_list(step_part::microbatch, mb, phase::forward);
        add_list(step_part::microbatch, mb, phase::backward);
    }
    add_list(step_part::step_end, -1, phase::forward);

    if (scope.impl == graph_impl::whole_iteration) {
        // The whole step is one graph: every call, in the order above.
        plan_segment whole;
        whole.part = step_part::step_begin;
        whole.first_call = 0;
        whole.call_count = static_cast<int>(plan.calls.size());
        whole.graphed = true;
        whole.graph = 0; // lanes fork and join inside it, call by call
        plan.segments = {whole};
        plan.graph_count = 1;
    }
    detail::check_capture_time_calls(plan, program);
    detail::check_guards(plan, program);
    detail::check_rerun(plan, program);
    detail::check_parameter_owners(plan, program);
    derive_stream_order(plan, program);
    if (const std::string& broken = detail::installed_breakage().drop_waits_from; !broken.empty())
        detail::drop_waits_from(plan, program, broken); // a test, broken on purpose
    else
        verify_stream_order(plan, program); // every plan, at set-up (milliseconds for a large model)
    return plan;
}

} // namespace capscope
