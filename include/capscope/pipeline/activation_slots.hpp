#pragma once
//! @file
//! Memory by in-flight slots, not by microbatches: a rank keeps a chunk's activations from its
//! forward of a microbatch to its backward of it, and the most it ever keeps at once is the
//! chunk's slot count. A FIFO allocator replays the rank's order and gives each forward a slot:
//! the first slot freed is the first reused, and no two live microbatches share one.

#include <capscope/pipeline/compute_order.hpp>

#include <algorithm>
#include <vector>

namespace capscope::pipeline {

//! Rank `rank`'s pass `k` keeps microbatch `microbatch`'s activations of chunk `chunk` in slot `slot`.
struct slot_use {
    int chunk = 0, microbatch = 0, slot = 0;
    int forward = 0, backward = 0; //!< their indices in the rank's compute order: the slot's lifetime
    friend constexpr bool operator==(const slot_use&, const slot_use&) = default;
};

struct slot_plan {
    std::vector<int> slots;     //!< per chunk: activation slots the rank needs
    std::vector<slot_use> uses; //!< per forward, in the rank's order
};

constexpr slot_plan plan_slots(const schedule_shape& s, int rank, int microbatches) {
    const std::vector<compute_action> order = compute_order(s, rank, microbatches);
    slot_plan plan{std::vector<int>(std::size_t(s.virtual_stages), 0), {}};
    // Per chunk: slots in the order freed, and the live uses (a chunk's backwards run in its
    // forwards' order in every schedule here, so both are queues: vector and read position).
    std::vector<std::vector<int>> free(std::size_t(s.virtual_stages)), live(std::size_t(s.virtual_stages));
    std::vector<std::size_t> next_free(std::size_t(s.virtual_stages), 0), next_live(std::size_t(s.virtual_stages), 0);
    for (int k = 0; k < int(order.size()); ++k) {
        const compute_action& a = order[std::size_t(k)];
        const std::size_t c = std::size_t(a.chunk);
        if (a.direction == pass::forward) {
            int slot = plan.slots[c];
            if (next_free[c] < free[c].size()) slot = free[c][next_free[c]++];
            else ++plan.slots[c];
            live[c].push_back(int(plan.uses.size()));
            plan.uses.push_back({a.chunk, a.microbatch, slot, k, -1});
            continue;
        }
        slot_use& u = plan.uses[std::size_t(live[c][next_live[c]++])];
        u.backward = k; // (u.microbatch == a.microbatch: the unit test checks every lifetime)
        free[c].push_back(u.slot);
    }
    return plan;
}

} // namespace capscope::pipeline
