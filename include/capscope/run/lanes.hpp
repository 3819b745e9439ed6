#pragma once
//! @file
//! Lanes: the runner's side streams, for work that overlaps later stages (capscope/stage/stage.hpp).
//! Work on lane k is forked from the step's stream where it is issued (an event recorded there,
//! waited for on side stream k), and its end is recorded in a "done" event that later work waits
//! for: the first stage that `waits_for` lane k, and, at the latest, the end of the step.
//!
//! The same four operations order lane work eagerly, between graph launches (per-layer impls),
//! and inside one capture (the whole iteration), where CUDA turns them into graph edges. Streams
//! and events are created the first time a lane is used (set-up, not replay); a plan without
//! lanes makes no call here at all.

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
    //! Marks the end of the work issued on lane `lane` so far.
    void done(int lane) {
        lane_slot& l = slot(lane);
        l.done.record(l.stream.get());
        pending_ |= bit(lane);
    }
    //! Makes `on` wait for the lanes in `lanes` that have work marked done.
    void wait(std::uint32_t lanes, cudaStream_t on) {
        for (std::uint32_t m = lanes & pending_; m != 0; m &= m - 1) {
            const int k = std::countr_zero(m);
            slots_[std::size_t(k)]->done.wait_on(on);
        }
    }
    //! Joins the lanes in `lanes` (all by default) with work back into `into` (the end of a step,
    //! or of a capture).
    void join(cudaStream_t into, std::uint32_t lanes = ~std::uint32_t{0}) {
        wait(lanes, into);
        pending_ &= ~lanes;
    }
    //! Lanes with work not yet joined.
    std::uint32_t pending() const noexcept { return pending_; }
    //! Forgets the work of `lanes` without waiting (a failed capture: the work was never issued).
    void forget(std::uint32_t lanes) noexcept { pending_ &= ~lanes; }
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
    static constexpr std::uint32_t bit(int lane) { return std::uint32_t{1} << lane; }
    lane_slot& slot(int lane) {
        if (lane < 1 || lane > max_lanes)
            throw std::out_of_range("capscope: lane " + std::to_string(lane) + " is outside 1.." + std::to_string(max_lanes));
        auto& l = slots_[std::size_t(lane)];
        if (!l) l.emplace();
        return *l;
    }
    std::array<std::optional<lane_slot>, max_lanes + 1> slots_{};
    std::uint32_t pending_ = 0;
};

} // namespace capscope
