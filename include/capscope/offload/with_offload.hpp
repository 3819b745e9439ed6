#pragma once
//! @file
//! Activation copies become stages of the training program, so every impl runs them where
//! the plan says, eager or captured, with no code of their own in the runner (as hooks do,
//! capscope/hooks/with_hooks.hpp). For each copied group, in every microbatch's list:
//! - `<layer>.<module>.to_host` (forward only, on its slot's lane): right after the stage that
//!   writes the tensors, as a *branch* of that stage's segment (forked inside its graph, joined
//!   at its end). With `delay_offload_until_cuda_graph` and that stage captured per layer, it
//!   moves after the segment instead: a graph of its own on the lane, launched right after the
//!   segment's replay, so the copy overlaps the next layer rather than lengthening this one;
//! - `<layer>.<module>.to_device` (backward only, on the same lane): just before the segment of
//!   the stage that writes the group that reuses its slot (its producer, at or before its
//!   keeper), so it runs right after the backward of both frees the slot, a prefetch ahead of
//!   its own backward;
//! - `wait_inflight` (forward only, with `max_inflight_offloads<N>`): after a copy out, a stage
//!   that reads the host copy of the group N groups earlier, so at most N copies out are in
//!   flight (0: each joins at once).
//! No wait is placed here. The copies declare what they read and write (out: the device tensors
//! and their host copies; back: the reverse), the stage that writes a ring member declares its
//! tensors, and the keeper's backward reads them (it saves them), so the plan derives each wait
//! (capscope/plan/stream_order.hpp): the keeper's backward after the copy back, the writer of a
//! slot's next group after the copy out of the one before, and the step's end after every copy.

#include <capscope/offload/offload_plan.hpp>
#include <capscope/plan/offload_placement.hpp>
#include <capscope/plan/training_plan.hpp>
#include <capscope/stage/program.hpp>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

namespace capscope {

//! A copied group's two copies: out (device to host) and back (host to device), as stream functions.
struct offload_copies {
    stream_fn out, back;
    std::vector<tensor_ref> device, host;
};

namespace detail {

inline stage offload_stage(const stage& like, const offload_group& g, std::string what, int lane) {
    stage s;
    s.name = "layer" + std::to_string(g.layer) + "." + std::string(g.module.view()) + "." + std::move(what);
    s.layer = like.layer;
    s.kind = stage_kind_id("offload");
    s.captured_by = like.captured_by;
    s.lane = lane;
    s.added = true;
    s.buffers_declared = true;
    return s;
}

//! A stage that does nothing on the step's stream but read `host` (in the forward): it runs
//! once the copy out that writes them is done.
inline stage read_stage(const stage& like, const offload_group& g, const char* what, const std::vector<tensor_ref>& host) {
    stage s = offload_stage(like, g, what, like.lane);
    s.inputs = host;
    s.forward = stream_fn::from([](stream_handle) {});
    return s;
}

//! The first and last stages of the segment that holds stage `i`; in the whole iteration, the
//! stage alone (its one graph orders every call by its own edges).
inline stage_range segment_of(const capture_scope& c, std::span<const stage_facts> facts, int i) {
    stage_range of{i, 1, false};
    if (c.impl == graph_impl::whole_iteration) return of;
    split_segments(c, facts, [&](stage_range r) {
        if (i >= r.first && i < r.first + r.count) of = r;
    });
    return of;
}

inline std::vector<stage> add_copies(const std::vector<stage>& list, const offload_plan& plan, std::span<const offload_copies> copies,
                                     const capture_scope& scope) {
    const auto facts = facts_of(list);
    const offload_name_set offloaded = plan.policy.enabled ? plan.policy.modules : offload_name_set{};
    check_offload_placement(scope, offloaded, facts, list);

    // Each ring member's producer and keeper in this list.
    std::vector<int> producer(plan.groups.size(), -1), keeper(plan.groups.size(), -1);
    for (int k = 0; k < int(list.size()); ++k)
        for (const saved_tensor& t : list[std::size_t(k)].saves) {
            const int g = plan.group_of(list[std::size_t(k)].layer, t.module);
            if (g < 0 || plan.groups[std::size_t(g)].member < 0) continue;
            if (keeper[std::size_t(g)] >= 0 && keeper[std::size_t(g)] != k)
                throw plan_error("P11", list[std::size_t(k)].name,
                                 "two stages of layer " + std::to_string(list[std::size_t(k)].layer) + " keep module input " +
                                     std::string(t.module.view()) + " ('" + list[std::size_t(keeper[std::size_t(g)])].name +
                                     "' and '" + list[std::size_t(k)].name + "')",
                                 "list each tensor a layer keeps in the saves of the one stage whose backward reads it");
            keeper[std::size_t(g)] = k;
            producer[std::size_t(g)] = producer_of(facts, k, t.module);
        }
    auto member_group = [&](const offload_group& g, int member) {
        for (std::size_t i = 0; i < plan.groups.size(); ++i)
            if (plan.groups[i].module == g.module && plan.groups[i].member == member) return int(i);
        return -1;
    };

    // Stages to put around each stage of the list, in list order: copies back (their own
    // segments, before the segment they precede), then in-flight limits (in the stage's segment),
    // the stage, its copies out. Each ring member's writer declares its tensors.
    std::vector<std::vector<stage>> backs(list.size()), waits(list.size()), outs(list.size());
    std::vector<std::vector<tensor_ref>> writes(list.size());
    const int k = plan.ring.slots;
    const auto& policy = plan.policy;
    // Every ring member needs its keeper here (the copies of one group are placed by the next's).
    for (std::size_t gi = 0; gi < plan.groups.size(); ++gi)
        if (plan.groups[gi].member >= 0 && keeper[gi] < 0)
            throw plan_error("P11", "", "no stage of layer " + std::to_string(plan.groups[gi].layer) + " keeps the offloaded module input " +
                                            std::string(plan.groups[gi].module.view()) + " declared for it",
                             "list the tensor in stage::saves of the stage whose backward reads it");
    for (std::size_t gi = 0; gi < plan.groups.size(); ++gi) {
        const offload_group& g = plan.groups[gi];
        if (g.member < 0) continue;
        const int p = producer[gi], keep = keeper[gi];
        for (const saved_tensor& t : list[std::size_t(keep)].saves)
            if (t.module == g.module) writes[std::size_t(p)].push_back(t.tensor);
        if (!g.copied) continue;
        const offload_copies& c = copies[gi];
        // The copy out: a branch of the producer's segment, or after it when delayed.
        const bool delayed = policy.delay_until_cuda_graph && is_per_layer(scope.impl) && inside_captured_region(scope, facts[std::size_t(p)]);
        const stage_range seg = segment_of(scope, facts, p);
        const int at = delayed ? seg.first + seg.count - 1 : p;
        stage out = offload_stage(list[std::size_t(p)], g, "to_host", g.lane);
        out.forward = c.out;
        out.branch = !delayed;
        out.inputs = c.device;
        out.outputs = c.host;
        outs[std::size_t(at)].push_back(std::move(out));
        if (policy.max_inflight && *policy.max_inflight < k && g.member >= *policy.max_inflight) {
            // Before the trainer's next stage, in its segment and on its lane (a hook added before
            // it may be on a side lane, where the wait would hold back nothing of the compute); at
            // the end of the list, after the copy.
            std::size_t next = std::size_t(at) + 1;
            while (next < list.size() && list[next].added) ++next;
            const bool last = next == list.size();
            if (last) next = std::size_t(at);
            const int earlier = member_group(g, g.member - *policy.max_inflight);
            (last ? outs[next] : waits[next]).push_back(read_stage(list[next], g, "wait_inflight", copies[std::size_t(earlier)].host));
        }
        // The copy back: right after the backward of the segment that holds the slot's next
        // tenant: its keeper, and its producer, whose backward reads what its forward wrote (a
        // copy between the two would make the producer's backward wait for it).
        const auto next = std::size_t(member_group(g, g.member + k));
        const int first_user = std::min(producer[next], keeper[next]);
        stage back = offload_stage(list[std::size_t(first_user)], g, "to_device", g.lane);
        back.backward = c.back;
        back.backward_inputs = c.host;
        back.backward_outputs = c.device;
        backs[std::size_t(segment_of(scope, facts, first_user).first)].push_back(std::move(back));
    }

    std::vector<stage> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        for (stage& s : backs[i]) out.push_back(std::move(s));
        for (stage& s : waits[i]) out.push_back(std::move(s));
        out.push_back(list[i]);
        for (const tensor_ref& t : writes[i])
            if (std::find(out.back().outputs.begin(), out.back().outputs.end(), t) == out.back().outputs.end()) out.back().outputs.push_back(t);
        for (stage& s : outs[i]) out.push_back(std::move(s));
    }
    return out;
}

} // namespace detail

//! The program with the plan's activation copies as stages, placed for `scope` (the runner's
//! `capture_scope_of<Config>`). `copies[g]` are group g's copy functions (an
//! `activation_store` makes them); they and the buffers they name must outlive the runner.
//! Throws `plan_error` P11 when a tensor's producer and keeper straddle a graph boundary.
inline training_program with_offload(const training_program& program, const offload_plan& plan, std::span<const offload_copies> copies,
                                     const capture_scope& scope) {
    if (copies.size() != plan.groups.size())
        throw std::invalid_argument("capscope::with_offload: " + std::to_string(copies.size()) + " copy pairs for " +
                                    std::to_string(plan.groups.size()) + " groups -- fix: pass the activation store's copies()");
    training_program out = program; // all but the layers' stages comes along (warmup hooks, the rerun, what is kept alive)
    out.microbatches.clear();
    if (plan.policy.enabled) out.offloaded.insert_all(plan.policy.modules); // P11 is checked again on the final program
    for (const auto& list : program.microbatches) out.microbatches.push_back(detail::add_copies(list, plan, copies, scope));
    return out;
}

} // namespace capscope
