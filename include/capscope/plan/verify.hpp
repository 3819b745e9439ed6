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

//! A segment that replays microbatch 0's graph replays that graph's edges: its calls must wait,
//! inside the graph, for the same calls (by position) as the twin's did.
inline std::optional<order_violation> same_edges_as_twin(const training_plan& plan, const training_program& program, int si) {
    const plan_segment& seg = plan.segments[std::size_t(si)];
    for (const plan_segment& twin : plan.segments) {
        if (!twin.graphed || twin.graph != seg.graph || twin.shared) continue;
        for (int k = 0; k < seg.call_count; ++k) {
            const auto mine = plan.waits_of(plan.calls[std::size_t(seg.first_call + k)].waits);
            const auto its = plan.waits_of(plan.calls[std::size_t(twin.first_call + k)].waits);
            bool same = mine.size() == its.size();
            for (std::size_t w = 0; same && w < mine.size(); ++w) same = mine[w].producer - seg.first_call == its[w].producer - twin.first_call;
            if (!same)
                return order_violation{-1, seg.first_call + k, "",
                                       call_words(plan, program, seg.first_call + k) + " replays graph g" + std::to_string(seg.graph) +
                                           ", whose edges microbatch 0 captured, but needs other waits inside it than microbatch 0's did"};
        }
        return std::nullopt;
    }
    return std::nullopt;
}

//! The first violation of one way of running the plan (`replayed`: graphed segments as graphs).
inline std::optional<order_violation> first_violation(const training_plan& plan, const training_program& program, bool replayed) {
    const std::size_t n = plan.calls.size();
    const std::vector<call_access> access = accesses_of(plan, program);
    std::array<call_set, stream_count> reach;
    for (auto& r : reach) r = call_set(n);
    std::vector<std::optional<call_set>> recorded(plan.events.size());
    std::vector<int> recorded_in(plan.events.size(), -1); //!< the graphed segment an event was recorded in (replayed)
    const char* mode = replayed ? "replayed" : "run eagerly";

    // `graph`: the graphed segment the waiting work is captured in, or -1. An event recorded inside
    // a graph is an edge of that graph only: no other graph and no stream outside sees it.
    auto wait = [&](wait_range r, int stream, const std::string& who, int graph) -> std::optional<order_violation> {
        for (const derived_wait& w : plan.waits_of(r)) {
            const bool known = w.event >= 0 && std::size_t(w.event) < recorded.size() && recorded[std::size_t(w.event)];
            if (!known || recorded_in[std::size_t(w.event)] != graph)
                return order_violation{w.producer, w.consumer, w.buffer,
                                       who + " waits for event " + std::to_string(w.event) +
                                           (known ? ", which is recorded inside another graph or outside this one" : ", which is not recorded before it in the step") +
                                           " (" + mode + ")"};
            reach[std::size_t(stream)] |= *recorded[std::size_t(w.event)];
        }
        return std::nullopt;
    };

    for (int si = 0; si < int(plan.segments.size()); ++si) {
        const plan_segment& seg = plan.segments[std::size_t(si)];
        const int origin = seg.lane;
        if (origin != 0) reach[std::size_t(origin)] |= reach[0];
        if (auto v = wait(seg.waits, origin, "a segment", -1)) return v;
        const bool in_graph = replayed && seg.graphed;
        if (in_graph && seg.shared)
            if (auto v = same_edges_as_twin(plan, program, si)) return v;
        for (int k = 1; k <= max_lanes; ++k) reach[std::size_t(graph_lane_stream(k))].clear();
        std::uint32_t forked = 0;
        for (int c = seg.first_call; c < seg.first_call + seg.call_count; ++c) {
            const stage_call& call = plan.calls[std::size_t(c)];
            const int x = stream_of_call(stage_of(program, call).lane, origin, in_graph);
            if (x != origin) {
                reach[std::size_t(x)] |= reach[std::size_t(origin)];
                forked |= std::uint32_t{1} << x;
            }
            if (auto v = wait(call.waits, x, call_words(plan, program, c), in_graph ? si : -1)) return v;
            const bool runs = replayed || !stage_of(program, call).capture_only; // a capture-time call runs while captured only
            for (int p = 0; runs && p < c; ++p) {
                if (reach[std::size_t(x)].contains(p)) continue;
                if (const auto b = conflict(access[std::size_t(p)], access[std::size_t(c)]))
                    return order_violation{p, c, *b,
                                           call_words(plan, program, c) + " and the earlier " + call_words(plan, program, p) + " both touch " + *b +
                                               ", one of them writing, and nothing orders them (" + mode + "): missing the edge from the end of " +
                                               "the earlier to the start of the later"};
            }
            reach[std::size_t(x)].insert(c);
            if (call.record >= 0) {
                recorded[std::size_t(call.record)] = reach[std::size_t(x)];
                recorded_in[std::size_t(call.record)] = in_graph ? si : -1;
            }
        }
        for (int x = 0; x < stream_count; ++x)
            if (forked & (std::uint32_t{1} << x)) reach[std::size_t(origin)] |= reach[std::size_t(x)];
        if (seg.record >= 0) recorded[std::size_t(seg.record)] = reach[std::size_t(origin)];
    }
    if (auto v = wait(plan.end_waits, 0, "the step's end", -1)) return v;
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
