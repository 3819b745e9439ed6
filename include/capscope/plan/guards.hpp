#pragma once
//! @file
//! The plan's checks of guarded stages (capscope/stage/stage_guard.hpp), before any capture:
//! - P14: a guarded stage runs inside a conditional graph node when captured, where the host
//!   cannot act: it may not synchronize with the host, launch data-dependent shapes or pass host
//!   values at launch (the same facts that keep a stage out of any graph).
//! - P15: the flag is written before it is read: some earlier call of the step writes it (in
//!   the same graph or an earlier one), and the calls of a WHILE run write it too, or the loop
//!   could never end. "Writes" is what the calls declare (capscope/plan/access.hpp).
//! - P16: a run of consecutive stages under one guard becomes one conditional node: it lies in
//!   one segment and on one lane.
//! - P17: a config with `nan_check_on_device` has its optimizer guarded (the runner checks).
//! - P18: a step the device may refuse (training_program::rerun) has a flag some call of the step
//!   writes and a step_begin stage clears, a `before` to put back what the refused step advanced,
//!   its optimizer guarded by a flag a gate writes from the rerun flag, and no collective (a
//!   rerun is one rank's own); a config with `static_expert_capacity` has such a program (the
//!   runner checks).

#include <capscope/plan/access.hpp>
#include <capscope/plan/plan_calls.hpp>
#include <capscope/plan/plan_error.hpp>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

namespace capscope::detail {

inline bool writes_flag(const call_access& a, const tensor_ref& flag) {
    if (a.everything) return true; // undeclared: may write anything
    for (const tensor_ref& w : a.writes)
        if (overlaps(w, flag)) return true;
    return false;
}

//! The guard checks over a plan's calls and segments. `stage_at(call)` gives a call's stage,
//! `access(call index)` what it touches, and `same_pass(a, b)` whether call a runs before call b
//! in one pass (a training step; an inference bucket's forward).
template <class StageAt, class Access, class SamePass>
void check_guard_runs(std::span<const stage_call> calls, std::span<const plan_segment> segments, StageAt&& stage_at, Access&& access,
                      SamePass&& same_pass) {
    std::vector<int> segment_of(calls.size(), -1);
    for (std::size_t g = 0; g < segments.size(); ++g)
        for (int k = 0; k < segments[g].call_count; ++k) segment_of[std::size_t(segments[g].first_call + k)] = int(g);
    for (std::size_t i = 0; i < calls.size();) {
        const stage& first = stage_at(calls[i]);
        if (!first.guard) {
            ++i;
            continue;
        }
        // The run: consecutive calls of one list under the same guard.
        std::size_t end = i + 1;
        while (end < calls.size() && same_list(calls[i], calls[end]) && stage_at(calls[end]).guard == first.guard) ++end;
        const stage_guard& guard = first.guard;
        const std::string flag = name_of(guard.predicate);
        if (!guard.predicate.data || guard.predicate.bytes < sizeof(int))
            throw plan_error("P15", first.name, "the guard of stage '" + first.name + "' has no flag ('" + flag + "' is " +
                                                    (guard.predicate.data ? std::to_string(guard.predicate.bytes) + " bytes" : std::string("null")) + ")",
                             "give run_if/run_while the int in device memory a kernel writes, as a tensor_ref of 4 bytes");
        bool body_writes = false;
        for (std::size_t k = i; k < end; ++k) {
            const stage& s = stage_at(calls[k]);
            if (!s.capturable())
                throw plan_error("P14", s.name,
                                 "guarded stage '" + s.name + "' " + misplacement_words(capture_problem(s.facts())) + ", but guarded stages run inside a conditional graph node "
                                 "(" + guard_word(guard.kind) + " '" + flag + "') when captured, where the host cannot act",
                                 "keep the guarded work on the device (values in device memory, shapes fixed), or move the host work out of the "
                                 "guarded stages");
            if (segment_of[k] != segment_of[i])
                throw plan_error("P16", s.name,
                                 "the stages guarded by " + std::string(guard_word(guard.kind)) + " '" + flag + "' from '" + first.name + "' to '" + s.name +
                                     "' fall in two segments (a graph boundary or an eager island lies between them), so they cannot be one conditional node",
                                 "put them in one capture region (the same layer, or step_begin/step_end; an inference forward: scope block, inference::per_block), or give each part its own flag");
            if (s.lane != first.lane)
                throw plan_error("P16", s.name,
                                 "the stages guarded by " + std::string(guard_word(guard.kind)) + " '" + flag + "' run on lanes " + std::to_string(first.lane) +
                                     " ('" + first.name + "') and " + std::to_string(s.lane) + " ('" + s.name + "'), so they cannot be one conditional node",
                                 "put a guarded run's stages on one lane");
            body_writes = body_writes || writes_flag(access(k), guard.predicate);
        }
        bool written_before = false;
        for (std::size_t k = 0; k < i && !written_before; ++k)
            written_before = same_pass(calls[k], calls[i]) && writes_flag(access(k), guard.predicate);
        if (!written_before)
            throw plan_error("P15", first.name,
                             "stage '" + first.name + "' is guarded by " + guard_word(guard.kind) + " '" + flag + "', which no earlier call of the step writes, "
                             "so the condition would be whatever a previous step left",
                             "write the flag in a stage that runs before '" + first.name + "' and declare it in that stage's outputs");
        if (guard.kind == guard_kind::while_holds && !body_writes)
            throw plan_error("P15", first.name,
                             "the stages guarded by WHILE '" + flag + "' (from '" + first.name + "') never write it, so the loop would never end once it holds",
                             "have the last guarded stage write the flag (and declare it in its outputs)");
        i = end;
    }
}

inline void check_guards(const training_plan& plan, const training_program& program) {
    check_guard_runs(
        plan.calls, plan.segments, [&](const stage_call& c) -> const stage& { return stage_of(program, c); },
        [&](std::size_t i) {
            const stage_call& c = plan.calls[i];
            return access_of(stage_of(program, c), c.direction, c.part, program);
        },
        [](const stage_call&, const stage_call&) { return true; });
}

//! P18, the plan's part: the rerun flag is an int some call of the step writes.
inline void check_rerun(const training_plan& plan, const training_program& program) {
    const step_rerun& r = program.rerun;
    if (!r) return;
    const std::string flag = name_of(r.flag);
    if (r.flag.bytes < sizeof(int))
        throw plan_error("P18", "", "the rerun flag '" + flag + "' is " + std::to_string(r.flag.bytes) + " bytes",
                         "give training_program::rerun the int in device memory a kernel sets, as a tensor_ref of 4 bytes");
    for (std::size_t i = 0; i < plan.calls.size(); ++i) {
        const stage_call& c = plan.calls[i];
        if (writes_flag(access_of(stage_of(program, c), c.direction, c.part, program), r.flag)) return;
    }
    throw plan_error("P18", "",
                     "the rerun flag '" + flag + "' is written by no call of the step, so the runner would read whatever an earlier step left",
                     "declare the flag among the outputs of the stage whose kernel sets it (and of the stage that clears it at the step's start)");
}

//! An optimizer stage guarded by run_if.
inline bool is_guarded_optimizer(const stage& s) { return s.kind == stage_kind_id{stage_kind::optimizer} && s.guard.kind == guard_kind::if_holds; }

//! P18, the program's part: a refused step must change nothing the rerun depends on. So its
//! optimizer is guarded by a flag that a gate before it writes from the rerun flag (never by the
//! rerun flag itself, which holds when the step must not update), a stage at the step's start
//! clears the flag, something puts back what the step advanced, and no collective runs twice on
//! one rank only (each rank reads its own flag).
inline void require_safe_rerun(const training_program& p, bool config_asks) {
    const step_rerun& r = p.rerun;
    if (!r) {
        if (config_asks)
            throw plan_error("P18", "",
                             "the config says the MoE layers have a static expert capacity (static_expert_capacity), but the program "
                             "declares no rerun (training_program::rerun), so a step past the capacity would drop tokens silently",
                             "build the program from a model with a static dropless capacity (the example model: "
                             "model_config::dropless_capacity_factor > 0), or drop static_expert_capacity");
        return;
    }
    const std::string flag = name_of(r.flag);
    if (!r.before)
        throw plan_error("P18", "",
                         "training_program::rerun has no 'before' function, so a rerun would start from what the refused step left "
                         "(a generator's advanced offset, a stage still on its capacity path)",
                         "set rerun.before to put back what a step advances and switch the stages to their host-sized path");
    auto writes = [](const stage& s, const tensor_ref& t) { return std::find(s.outputs.begin(), s.outputs.end(), t) != s.outputs.end(); };
    auto reads = [](const stage& s, const tensor_ref& t) { return std::find(s.inputs.begin(), s.inputs.end(), t) != s.inputs.end(); };
    bool cleared = false;
    for (const stage& s : p.step_begin) cleared = cleared || writes(s, r.flag);
    if (!cleared)
        throw plan_error("P18", "",
                         "no step_begin stage writes the rerun flag '" + flag + "', so once set it would stay set and every later step would be refused",
                         "clear the flag in a step_begin stage and declare it among that stage's outputs");
    // A stage that declares collective calls is a collective wherever it runs: on the step's own
    // stream (lane 0) too, a hook's all-reduce would run again on one rank only, and the ranks hang.
    auto refuse_collectives = [](const std::vector<stage>& list) {
        for (const stage& s : list)
            if (s.kind == stage_kind_id("collective") || !s.collective_calls.empty() || (s.kind == stage_kind_id("hook") && s.lane != 0))
                throw plan_error("P18", s.name,
                                 "stage '" + s.name + "' is a collective (or a hook on a side lane), and a refused step runs every call again on the rank "
                                 "whose flag was set, and only there, so the ranks' collectives would no longer match",
                                 "keep collectives out of a program whose steps may be refused (each rank decides its rerun alone)");
    };
    refuse_collectives(p.step_begin);
    for (const auto& list : p.microbatches) refuse_collectives(list);
    refuse_collectives(p.step_end);
    // Every optimizer stage (a model may update layer by layer) is guarded by a flag that a gate
    // before it writes from the rerun flag.
    if (std::none_of(p.step_end.begin(), p.step_end.end(), is_guarded_optimizer))
        throw plan_error("P18", "",
                         "the program declares a rerun when '" + flag + "' is set, but no optimizer stage of step_end is guarded by run_if, so "
                         "the refused step would update the weights before its rerun does",
                         "guard the optimizer with run_if(flag), a flag a gate stage clears whenever '" + flag + "' is set");
    for (std::size_t i = 0; i < p.step_end.size(); ++i) {
        const stage& opt = p.step_end[i];
        if (opt.kind != stage_kind_id{stage_kind::optimizer}) continue;
        if (!is_guarded_optimizer(opt))
            throw plan_error("P18", opt.name,
                             "the optimizer stage '" + opt.name + "' is not guarded by run_if, so a refused step would update its weights "
                             "before the rerun does",
                             "guard every optimizer stage with run_if(flag), the flag the gate stage clears whenever '" + flag + "' is set");
        if (opt.guard.predicate == r.flag)
            throw plan_error("P18", opt.name,
                             "the optimizer is guarded by the rerun flag '" + flag + "' itself, so it would update exactly in the refused steps",
                             "guard it by a flag a gate stage writes: set when '" + flag + "' is clear (the example model's update_gate)");
        bool gated = false;
        for (std::size_t k = 0; k < i && !gated; ++k) gated = reads(p.step_end[k], r.flag) && writes(p.step_end[k], opt.guard.predicate);
        if (!gated)
            throw plan_error("P18", opt.name,
                             "the optimizer is guarded by '" + name_of(opt.guard.predicate) + "', which no step_end stage before it writes from the rerun flag '" +
                                 flag + "', so a refused step could still update the weights",
                             "put a gate stage before the optimizer that reads '" + flag + "' (in its inputs) and writes the optimizer's flag (in its outputs)");
    }
}

//! P17: a config that checks loss and gradients on the device (`nan_check_on_device`) has a
//! program whose optimizer is guarded by the check's flag; otherwise the check would change
//! nothing, silently.
inline void require_guarded_optimizer(const training_program& p) {
    if (std::any_of(p.step_end.begin(), p.step_end.end(), is_guarded_optimizer)) {
        for (const stage& s : p.step_end) // every one of them, where a model updates layer by layer
            if (s.kind == stage_kind_id{stage_kind::optimizer} && !is_guarded_optimizer(s))
                throw plan_error("P17", s.name,
                                 "the config checks loss and gradients on the device (nan_check_on_device), but the optimizer stage '" + s.name +
                                     "' is not guarded by run_if, so a step with an inf or a NaN would still update its weights",
                                 "guard every optimizer stage with run_if(flag), the finite check's flag");
        return;
    }
    throw plan_error("P17", "",
                     "the config checks loss and gradients on the device (nan_check_on_device), but no optimizer stage of step_end "
                     "(stage_kind::optimizer) is guarded by run_if, so a step with an inf or a NaN would still update the weights",
                     "guard the optimizer with run_if(flag), the flag written by a finite check of loss and gradients before it (the "
                     "example model: model_config::check_finite_on_device), or drop nan_check_on_device");
}

} // namespace capscope::detail
