#pragma once
//! @file
//! The plan of a training step, as data (pure host): every stage call of one step in execution
//! order, the segments they form (graphs and eager islands), and the stream order between them:
//! the events recorded after calls or segments, and the waits for them, each derived from what
//! two calls touch (capscope/plan/stream_order.hpp). `make_training_plan`
//! (capscope/plan/training_plan.hpp) makes one; the runner follows it to the letter, and the
//! verifier (capscope/plan/verify.hpp) checks it.

#include <capscope/plan/capture_region.hpp>
#include <capscope/plan/segment.hpp>
#include <capscope/stage/program.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace capscope {

//! A range of `training_plan::waits`: what one call, one segment or the step's end waits for.
struct wait_range {
    int first = 0;
    int count = 0;
};

//! One call of a stage function: which list, which stage, which phase.
struct stage_call {
    step_part part = step_part::microbatch;
    int microbatch = -1; //!< -1 for step_begin / step_end
    int stage = 0;       //!< index in its list
    phase direction = phase::forward;
    //! Inside its segment: the waits its stream makes right before it (for calls of the same
    //! segment on other streams), and the event recorded right after it (-1: none).
    wait_range waits;
    int record = -1;
};

//! Whether two calls come from one stage list and pass (step_begin, a microbatch's forward or
//! backward, step_end): a guarded run never crosses from one to the next.
inline bool same_list(const stage_call& a, const stage_call& b) {
    return a.part == b.part && a.microbatch == b.microbatch && a.direction == b.direction;
}

struct plan_segment {
    step_part part = step_part::microbatch;
    int microbatch = -1;
    phase direction = phase::forward;
    int layer = -1;      //!< the layer of its stages; -1 outside the layers (or the whole step)
    int first_call = 0;  //!< into training_plan::calls
    int call_count = 0;
    bool graphed = false;
    int graph = -1;      //!< graph number when graphed
    bool shared = false; //!< reuses the graph of an earlier microbatch
    //! A graphed segment of a later microbatch that could have shared microbatch 0's graph but
    //! has its own because this call's stage (an index into training_plan::calls) leaves its
    //! buffers undeclared; -1 otherwise.
    int undeclared_call = -1;
    int lane = 0; //!< the stream it runs on: 0 the step's, k the runner's side stream k
    //! The waits its stream makes before it runs (for work of earlier segments on other
    //! streams), and the event recorded after it (-1: none).
    wait_range waits;
    int record = -1;
};

//! A wait the plan derived: `consumer` touches `buffer`, which `producer` (an earlier call, on
//! another stream) touches too, one of them writing; so the consumer's stream waits for
//! `event`, recorded after the producer (or after the producer's segment).
struct derived_wait {
    int event = -1;
    int producer = -1; //!< a call
    int consumer = -1; //!< a call; -1 for the step's end (the step's stream waits for every lane)
    std::string buffer;
};

//! An event of the plan: recorded after `call` inside its segment, or after segment `segment`.
struct plan_event {
    int call = -1;
    int segment = -1;
};

struct training_plan {
    capture_scope scope;
    int warmup_steps = 0;
    int microbatches = 0;
    std::vector<stage_call> calls;      //!< one step, in execution order
    std::vector<plan_segment> segments; //!< one step, in execution order, covering `calls`
    int graph_count = 0;                //!< graphs numbered 0.. in capture order
    std::vector<derived_wait> waits;    //!< grouped by consumer: segments' and calls' ranges point here
    std::vector<plan_event> events;     //!< the runner keeps one CUDA event per entry
    wait_range end_waits;               //!< before step() returns, on the step's stream

    int graph_launches_per_step() const {
        int n = 0;
        for (const auto& s : segments) n += s.graphed ? 1 : 0;
        return n;
    }
    int eager_islands_per_step() const { return static_cast<int>(segments.size()) - graph_launches_per_step(); }
    int eager_calls_per_step() const {
        int n = 0;
        for (const auto& s : segments) n += s.graphed ? 0 : s.call_count;
        return n;
    }
    std::span<const derived_wait> waits_of(wait_range r) const { return {waits.data() + r.first, std::size_t(r.count)}; }
};

//! The stage list a call refers to.
inline const std::vector<stage>& stage_list(const training_program& p, step_part part, int microbatch) {
    switch (part) {
    case step_part::step_begin: return p.step_begin;
    case step_part::step_end: return p.step_end;
    case step_part::microbatch: break;
    }
    return p.microbatches[static_cast<std::size_t>(microbatch)];
}
inline const stage& stage_of(const training_program& p, const stage_call& c) {
    return stage_list(p, c.part, c.microbatch)[static_cast<std::size_t>(c.stage)];
}

} // namespace capscope
