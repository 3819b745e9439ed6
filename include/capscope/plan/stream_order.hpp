#pragma once
//! @file
//! Stream order, derived (pure host). Work on one stream runs in the order issued; work on a lane
//! is forked from the stream that issues it, so it runs after everything issued there before.
//! What remains is a call that comes *after* work on another stream and touches what that work
//! writes, or writes what it reads (capscope/plan/access.hpp). For each such pair the plan puts
//! one wait on the later call's stream, for an event recorded right after the earlier call
//! (inside one segment) or after its segment (across segments), unless an earlier wait, the
//! stream's own order or a fork already orders them: one wait per dependency, none repeated.
//! Before `step()` returns, the step's stream waits for the last work of every lane, so the next
//! step, and whoever reads the step's results, comes after all of it.
//!
//! Inside a captured segment a branch is a node of the graph, ordered only by the graph's edges:
//! not after earlier work on its lane, which an eager run would give. The order is derived for
//! the weaker of the two, so it holds eager, captured and replayed.

#include <capscope/plan/plan_calls.hpp>
#include <capscope/plan/access.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace capscope {

namespace detail {

//! A set of calls, by index.
class call_set {
public:
    explicit call_set(std::size_t n = 0) : words_((n + 63) / 64, 0) {}
    void insert(int i) { words_[std::size_t(i) / 64] |= std::uint64_t{1} << (i % 64); }
    bool contains(int i) const { return (words_[std::size_t(i) / 64] >> (i % 64)) & 1u; }
    call_set& operator|=(const call_set& o) {
        for (std::size_t k = 0; k < words_.size(); ++k) words_[k] |= o.words_[k];
        return *this;
    }
    void clear() { std::fill(words_.begin(), words_.end(), 0); }

private:
    std::vector<std::uint64_t> words_;
};

//! Streams as the plan sees them: 0 the step's, 1..max_lanes the lanes' side streams, and
//! max_lanes + k lane k inside the graph being captured (fresh in every graphed segment).
inline constexpr int stream_count = 2 * max_lanes + 1;
static_assert(stream_count < 32, "the plan keeps sets of streams in 32-bit masks");
constexpr int graph_lane_stream(int lane) { return max_lanes + lane; }

//! The stream call `c`'s work runs on, in a segment on `origin_lane`.
constexpr int stream_of_call(int call_lane, int origin_lane, bool in_graph) {
    if (call_lane == origin_lane) return origin_lane;
    return in_graph ? graph_lane_stream(call_lane) : call_lane;
}

//! Every call's accesses, in plan order.
inline std::vector<call_access> accesses_of(const training_plan& plan, const training_program& program) {
    std::vector<call_access> out;
    out.reserve(plan.calls.size());
    for (const stage_call& c : plan.calls) out.push_back(access_of(stage_of(program, c), c.direction, c.part, program));
    return out;
}

class order_deriver {
public:
    order_deriver(training_plan& plan, const training_program& program)
        : plan_(plan), program_(program), access_(accesses_of(plan, program)), n_(plan.calls.size()), after_(n_, call_set(n_)),
          segment_end_(plan.segments.size(), call_set(n_)), segment_of_(n_, -1) {
        for (auto& r : reach_) r = call_set(n_);
        for (int s = 0; s < int(plan.segments.size()); ++s)
            for (int k = 0; k < plan.segments[std::size_t(s)].call_count; ++k) segment_of_[std::size_t(plan.segments[std::size_t(s)].first_call + k)] = s;
        plan_.waits.clear();
        plan_.events.clear();
    }

    void run() {
        for (int s = 0; s < int(plan_.segments.size()); ++s) segment(s);
        // The step's end: the step's stream waits for every call not yet ordered before it.
        plan_.end_waits.first = int(plan_.waits.size());
        const call_set before_end = reach_[0];
        for (int p = latest_outside(reach_[0], int(n_)); p >= 0; p = latest_outside(reach_[0], p)) {
            const int s = segment_of(p);
            plan_.waits.push_back({segment_event(s), p, -1, "(the step's end)"});
            reach_[0] |= segment_end_[std::size_t(s)];
        }
        reach_[0] = prune(plan_.end_waits.first, before_end, [&](const call_set& known) { return latest_outside(known, int(n_)) < 0; });
        plan_.end_waits.count = int(plan_.waits.size()) - plan_.end_waits.first;
        drop_unused_events();
    }

private:
    void segment(int si) {
        plan_segment& seg = plan_.segments[std::size_t(si)];
        const int origin = seg.lane;
        if (origin != 0) reach_[std::size_t(origin)] |= reach_[0]; // forked from the step's stream
        const int first = seg.first_call, end = seg.first_call + seg.call_count;
        // Waits before the segment, for calls of earlier segments.
        seg.waits.first = int(plan_.waits.size());
        const call_set before = reach_[std::size_t(origin)];
        auto known_by = [&](const call_set& at_origin, int c) {
            const int lane = stage_of(program_, plan_.calls[std::size_t(c)]).lane;
            call_set known = at_origin;
            if (!seg.graphed && lane != origin) known |= reach_[std::size_t(lane)];
            return known;
        };
        for (int c = first; c < end; ++c) {
            call_set known = known_by(reach_[std::size_t(origin)], c);
            for (int p = needed_before(known, c, first); p >= 0; p = needed_before(known, c, first)) {
                const int ps = segment_of(p);
                plan_.waits.push_back({segment_event(ps), p, c, *conflict(access_[std::size_t(p)], access_[std::size_t(c)])});
                reach_[std::size_t(origin)] |= segment_end_[std::size_t(ps)];
                known |= segment_end_[std::size_t(ps)];
            }
        }
        // A wait that a later one covers goes (one wait per dependency).
        reach_[std::size_t(origin)] = prune(seg.waits.first, before, [&](const call_set& at_origin) {
            for (int c = first; c < end; ++c)
                if (needed_before(known_by(at_origin, c), c, first) >= 0) return false;
            return true;
        });
        seg.waits.count = int(plan_.waits.size()) - seg.waits.first;
        // Inside the segment: forks, waits for calls of this segment on other streams, joins.
        for (int k = 1; k <= max_lanes; ++k) reach_[std::size_t(graph_lane_stream(k))].clear();
        std::uint32_t forked = 0;
        for (int c = first; c < end; ++c) {
            stage_call& call = plan_.calls[std::size_t(c)];
            const int x = stream_of_call(stage_of(program_, call).lane, origin, seg.graphed);
            if (x != origin) {
                reach_[std::size_t(x)] |= reach_[std::size_t(origin)];
                forked |= std::uint32_t{1} << x;
            }
            call.waits.first = int(plan_.waits.size());
            const call_set before_call = reach_[std::size_t(x)];
            for (int p = needed_before(reach_[std::size_t(x)], c, c); p >= 0; p = needed_before(reach_[std::size_t(x)], c, c)) {
                plan_.waits.push_back({call_event(p), p, c, *conflict(access_[std::size_t(p)], access_[std::size_t(c)])});
                reach_[std::size_t(x)] |= after_[std::size_t(p)];
            }
            reach_[std::size_t(x)] = prune(call.waits.first, before_call, [&](const call_set& known) { return needed_before(known, c, c) < 0; });
            call.waits.count = int(plan_.waits.size()) - call.waits.first;
            reach_[std::size_t(x)].insert(c);
            after_[std::size_t(c)] = reach_[std::size_t(x)];
        }
        for (int x = 0; x < stream_count; ++x)
            if (forked & (std::uint32_t{1} << x)) reach_[std::size_t(origin)] |= reach_[std::size_t(x)];
        segment_end_[std::size_t(si)] = reach_[std::size_t(origin)];
    }

    //! What event `e` orders: its segment's end, or its call.
    const call_set& reach_of(int e) const {
        const plan_event& ev = plan_.events[std::size_t(e)];
        return ev.call >= 0 ? after_[std::size_t(ev.call)] : segment_end_[std::size_t(ev.segment)];
    }
    //! Drops the waits from `first` on (the tail of plan_.waits) that the others cover while
    //! `enough(known)` still holds; returns `base` with what the kept waits order.
    template <class Enough>
    call_set prune(int first, const call_set& base, Enough&& enough) {
        auto known_without = [&](int skip) {
            call_set known = base;
            for (int i = first; i < int(plan_.waits.size()); ++i)
                if (i != skip) known |= reach_of(plan_.waits[std::size_t(i)].event);
            return known;
        };
        for (int i = first; i < int(plan_.waits.size());) {
            if (int(plan_.waits.size()) - first > 1 && enough(known_without(i))) plan_.waits.erase(plan_.waits.begin() + i);
            else ++i;
        }
        return known_without(-1);
    }
    //! Events no wait uses any more are not recorded; the others are numbered again from 0.
    void drop_unused_events() {
        std::vector<int> renumber(plan_.events.size(), -1);
        for (const derived_wait& w : plan_.waits) renumber[std::size_t(w.event)] = 0;
        std::vector<plan_event> kept;
        for (std::size_t e = 0; e < plan_.events.size(); ++e)
            if (renumber[e] == 0) {
                renumber[e] = int(kept.size());
                kept.push_back(plan_.events[e]);
            }
        for (derived_wait& w : plan_.waits) w.event = renumber[std::size_t(w.event)];
        for (stage_call& c : plan_.calls)
            if (c.record >= 0) c.record = renumber[std::size_t(c.record)];
        for (plan_segment& s : plan_.segments)
            if (s.record >= 0) s.record = renumber[std::size_t(s.record)];
        plan_.events = std::move(kept);
    }

    //! The latest call before `limit` that conflicts with call `c` and is not in `known`; -1 if none.
    int needed_before(const call_set& known, int c, int limit) const {
        for (int p = limit - 1; p >= 0; --p)
            if (!known.contains(p) && conflict(access_[std::size_t(p)], access_[std::size_t(c)])) return p;
        return -1;
    }
    //! The latest call before `limit` not in `known`; -1 if none.
    static int latest_outside(const call_set& known, int limit) {
        for (int p = limit - 1; p >= 0; --p)
            if (!known.contains(p)) return p;
        return -1;
    }
    int segment_of(int call) const { return segment_of_[std::size_t(call)]; }
    int segment_event(int s) {
        int& r = plan_.segments[std::size_t(s)].record;
        if (r < 0) {
            r = int(plan_.events.size());
            plan_.events.push_back({-1, s});
        }
        return r;
    }
    int call_event(int c) {
        int& r = plan_.calls[std::size_t(c)].record;
        if (r < 0) {
            r = int(plan_.events.size());
            plan_.events.push_back({c, -1});
        }
        return r;
    }

    training_plan& plan_;
    const training_program& program_;
    std::vector<call_access> access_;
    std::size_t n_;
    std::array<call_set, stream_count> reach_; //!< per stream: the calls ordered before its next work
    std::vector<call_set> after_;              //!< per call: what its event (if recorded) orders
    std::vector<call_set> segment_end_;        //!< per segment: what its event orders
    std::vector<int> segment_of_;              //!< per call: its segment
};

//! Removes wait `i` from `plan`: the range that held it shrinks, the later ones shift.
inline void erase_wait(training_plan& plan, int i) {
    auto fix = [i](wait_range& r) {
        if (i >= r.first && i < r.first + r.count) --r.count;
        else if (r.first > i) --r.first;
    };
    for (stage_call& c : plan.calls) fix(c.waits);
    for (plan_segment& s : plan.segments) fix(s.waits);
    fix(plan.end_waits);
    plan.waits.erase(plan.waits.begin() + i);
}

} // namespace detail

//! Derives `plan`'s events and waits from what its calls touch (see the file comment).
inline void derive_stream_order(training_plan& plan, const training_program& program) {
    for (stage_call& c : plan.calls) c.waits = {}, c.record = -1;
    for (plan_segment& s : plan.segments) s.waits = {}, s.record = -1;
    detail::order_deriver(plan, program).run();
}

} // namespace capscope
