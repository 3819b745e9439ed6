#pragma once
//! @file
//! The plan verifier (pure host): replays a step's stream operations as the runner issues them
//! (forks, the plan's waits and events, joins at a segment's end, the waits before `step()`
//! returns) and builds the happens-before relation of the calls from them alone, not from how
//! they were derived. It proves that every two calls that touch one buffer, one of them
//! writing, are ordered as issued, and that the step's stream is after every call when the step
//! returns (so the next step, microbatch or reader of the results is too). It checks both ways a
//! plan runs: eagerly (warmup, impl `none`, a graph run eagerly) and replayed, where a branch
//! inside a graph is ordered only by the graph's edges.
//!
//! Scratch memory needs no proof here: only calls on the step's stream may take scratch (a call
//! on a lane that asks is refused, capscope/run/scratch.hpp), and those run one after another.

#include <capscope/plan/plan_error.hpp>
#include <capscope/plan/stream_order.hpp>

#include <optional>
#include <string>
#include <vector>

namespace capscope {

//! Why a plan's order is wrong: two calls, what they share, and the edge that would order them.
struct order_violation {
    int first = -1;  //!< the earlier call (index into training_plan::calls)
    int second = -1; //!< the later call; -1 for the step's end
    std::string buffer;
    std::string message;
};

namespace detail {

inline std::string call_words(const training_plan& plan, const training_program& program, int call) {
    const stage_call& c = plan.calls[std::size_t(call)];
    const stage& s = stage_of(program, c);
    std::string where = c.part == step_part::step_begin ? "step begin" : c.part == step_part::step_end ? "step end"
                                                                                                          : "microbatch " + std::to_string(c.microbatch);
    return "'" + s.name + "' (" + where + ", " + std::string(phase_name(c.direction)) + ", lane " + std::to_string(s.lane) + ")";
}

//! The first violation of one way of running the plan (`replayed`: graphed segments as graphs).
inline std::optional<order_violation> first_violation(const training_plan& plan, const training_program& program, bool replayed) {
    const std::size_t n = plan.calls.size();
    const std::vector<call_access> access = accesses_of(plan, program);
    std::array<call_set, stream_count> reach;
    for (auto& r : reach) r = call_set(n);
    std::vector<std::optional<call_set>> recorded(plan.events.size());
    const char* mode = replayed ? "replayed" : "run eagerly";

    auto wait = [&](wait_range r, int stream, const std::string& who) -> std::optional<order_violation> {
        for (const derived_wait& w : plan.waits_of(r)) {
            if (w.event < 0 || std::size_t(w.event) >= recorded.size() || !recorded[std::size_t(w.event)])
                return order_violation{w.producer, w.consumer, w.buffer,
                                       who + " waits for event " + std::to_string(w.event) + ", which is not recorded before it in the step (" + mode + ")"};
            reach[std::size_t(stream)] |= *recorded[std::size_t(w.event)];
        }
        return std::nullopt;
    };

    for (const plan_segment& seg : plan.segments) {
        const int origin = seg.lane;
        if (origin != 0) reach[std::size_t(origin)] |= reach[0];
        if (auto v = wait(seg.waits, origin, "a segment")) return v;
        const bool in_graph = replayed && seg.graphed;
        for (int k = 1; k <= max_lanes; ++k) reach[std::size_t(graph_lane_stream(k))].clear();
        std::uint32_t forked = 0;
        for (int c = seg.first_call; c < seg.first_call + seg.call_count; ++c) {
            const stage_call& call = plan.calls[std::size_t(c)];
            const int x = stream_of_call(stage_of(program, call).lane, origin, in_graph);
            if (x != origin) {
                reach[std::size_t(x)] |= reach[std::size_t(origin)];
                forked |= std::uint32_t{1} << x;
            }
            if (auto v = wait(call.waits, x, call_words(plan, program, c))) return v;
            for (int p = 0; p < c; ++p) {
                if (reach[std::size_t(x)].contains(p)) continue;
                if (const auto b = conflict(access[std::size_t(p)], access[std::size_t(c)]))
                    return order_violation{p, c, *b,
                                           call_words(plan, program, c) + " and the earlier " + call_words(plan, program, p) + " both touch " + *b +
                                               ", one of them writing, and nothing orders them (" + mode + "): the edge from the second's " +
                                               "end to the first's start is missing"};
            }
            reach[std::size_t(x)].insert(c);
            if (call.record >= 0) recorded[std::size_t(call.record)] = reach[std::size_t(x)];
        }
        for (int x = 0; x < stream_count; ++x)
            if (forked & (std::uint32_t{1} << x)) reach[std::size_t(origin)] |= reach[std::size_t(x)];
        if (seg.record >= 0) recorded[std::size_t(seg.record)] = reach[std::size_t(origin)];
    }
    if (auto v = wait(plan.end_waits, 0, "the step's end")) return v;
    for (int p = 0; p < int(n); ++p)
        if (!reach[0].contains(p))
            return order_violation{p, -1, "",
                                   call_words(plan, program, p) + " may still run when step() returns (" + mode +
                                       "): the step's stream does not wait for it, so the next step, or a read of the results, races with it"};
    return std::nullopt;
}

} // namespace detail

//! The first way `plan` leaves two conflicting calls unordered, eager or replayed; none if it orders them all.
inline std::optional<order_violation> find_order_violation(const training_plan& plan, const training_program& program) {
    if (auto v = detail::first_violation(plan, program, false)) return v;
    return detail::first_violation(plan, program, true);
}

//! Throws `plan_error` P12 naming the two calls, the buffer and the missing edge when `plan`
//! leaves two conflicting calls unordered.
inline void verify_stream_order(const training_plan& plan, const training_program& program) {
    if (const auto v = find_order_violation(plan, program))
        throw plan_error("P12", v->second >= 0 ? stage_of(program, plan.calls[std::size_t(v->second)]).name : std::string(),
                         "the plan's stream order is wrong: " + v->message,
                         "this is capscope's bug if the stages declare every buffer they share with other streams (inputs, outputs, "
                         "backward_inputs, backward_outputs, saves); otherwise declare them");
}

} // namespace capscope
