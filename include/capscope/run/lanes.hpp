#pragma once
//! @file
//! Lanes: the runner's side streams, for work that overlaps later stages (capscope/stage/stage.hpp).
//! Work on lane k is forked from the stream that issues it (an event recorded there, waited for
//! on side stream k); a segment that forked lanes joins them back into its stream before it ends.
//! Every other wait is the plan's (capscope/plan/stream_order.hpp): events the runner records
//! after the calls and segments the plan names, and waits for before the calls, segments and
//! step end that need them.
//!
//! The same operations order lane work eagerly, between graph launches (per-layer impls), and
//! inside one capture, where CUDA turns them into graph edges. Streams and events are created
//! the first time they are used (set-up, not replay); a plan without lanes makes no call here.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/stage/stage.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace capscope {

class lane_streams {
public:
    //! Side stream `lane` (1..max_lanes), created on first use.
    cudaStream_t stream(int lane) { return slot(lane).stream.get(); }

    //! Orders lane `lane` after the work issued on `from` so far; returns the lane's stream.
    cudaStream_t fork(int lane, cudaStream_t from) {
        lane_slot& l = slot(lane);
        l.forked.record(from);
        l.forked.wait_on(l.stream.get());
        return l.stream.get();
    }
    //! Joins the work issued so far on the lanes in `lanes` into `into` (the end of a segment).
    void join(cudaStream_t into, std::uint32_t lanes) {
        for (std::uint32_t m = lanes; m != 0; m &= m - 1) {
            lane_slot& l = slot(std::countr_zero(m));
            l.done.record(l.stream.get());
            l.done.wait_on(into);
        }
    }
    //! The side streams created so far, for ending a failed capture on each.
    template <class F>
    void for_each_stream(F&& f) const {
        for (const auto& l : slots_)
            if (l) f(l->stream.get());
    }

private:
    struct lane_slot {
        cuda::stream stream;
        cuda::event forked, done;
    };
    lane_slot& slot(int lane) {
        if (lane < 1 || lane > max_lanes)
            throw std::out_of_range("capscope: lane " + std::to_string(lane) + " is outside 1.." + std::to_string(max_lanes));
        auto& l = slots_[std::size_t(lane)];
        if (!l) l.emplace();
        return *l;
    }
    std::array<std::optional<lane_slot>, max_lanes + 1> slots_{};
};

} // namespace capscope
