#pragma once
//! @file
//! Memory by in-flight slots, not by microbatches: a rank keeps a chunk's activations from their
//! arrival (its receive, or its forward on the first stage) to its backward of them, and the most
//! it ever keeps at once is the chunk's slot count. A FIFO allocator replays the rank's program
//! and gives each a slot: the first slot freed is the first reused, and no two live microbatches
//! share one. Received gradients get slots the same way, from their receive to their backward.

#include <capscope/pipeline/p2p_program.hpp>

#include <algorithm>
#include <vector>

namespace capscope::pipeline {

//! Rank `rank` keeps microbatch `microbatch`'s activations of chunk `chunk` in slot `slot`,
//! from its receive (issued after pass `received`; -1 before the first, or the forward's own
//! index minus one where nothing is received) or its forward, to its backward.
struct slot_use {
    int chunk = 0, microbatch = 0, slot = 0;
    int forward = -1, backward = -1; //!< their indices in the rank's compute order
    int received = -1;               //!< the pass after which its activation arrives; forward - 1 if none does
    friend constexpr bool operator==(const slot_use&, const slot_use&) = default;
};

//! A received gradient kept in slot `slot` from its receive to its backward (Megatron's grouping
//! receives some a step, or ranks - 1 steps, ahead).
struct gradient_use {
    int chunk = 0, microbatch = 0, slot = 0;
    int received = -1, backward = -1;
    friend constexpr bool operator==(const gradient_use&, const gradient_use&) = default;
};

struct slot_plan {
    std::vector<int> slots;             //!< per chunk: activation slots the rank needs
    std::vector<slot_use> uses;         //!< per microbatch and chunk, in the order their slots are taken
    int gradient_slots = 0;             //!< received gradients kept at once
    std::vector<gradient_use> gradients; //!< per received gradient, in the order they arrive
};

//! Slots for rank `rank`'s program (program_of: its passes and where its receives are issued),
//! each taken at the receive or the forward and freed by the backward, first freed first reused.
constexpr slot_plan plan_slots(const schedule_shape& s, int rank, int microbatches) {
    const rank_program program = program_of(s, rank, microbatches);
    const std::vector<compute_action>& order = program.compute;
    const std::size_t chunks = std::size_t(s.virtual_stages), mbs = std::size_t(microbatches);
    slot_plan plan{std::vector<int>(chunks, 0), {}, 0, {}};
    std::vector<std::vector<int>> free(chunks);
    std::vector<std::size_t> next_free(chunks, 0);
    std::vector<int> gradient_free;
    std::size_t next_gradient_free = 0;
    std::vector<int> use_of(chunks * mbs, -1), gradient_of(chunks * mbs, -1); // (chunk, microbatch) -> index
    auto take_slot = [&](int chunk, int mb, int received) {
        const std::size_t c = std::size_t(chunk);
        int slot = plan.slots[c];
        if (next_free[c] < free[c].size()) slot = free[c][next_free[c]++];
        else ++plan.slots[c];
        use_of[c * mbs + std::size_t(mb)] = int(plan.uses.size());
        plan.uses.push_back({chunk, mb, slot, -1, -1, received});
    };
    std::size_t g = 0;
    for (int k = -1; k < int(order.size()); ++k) {
        if (k >= 0) {
            const compute_action& a = order[std::size_t(k)];
            const std::size_t at = std::size_t(a.chunk) * mbs + std::size_t(a.microbatch);
            if (a.direction == pass::forward) {
                if (use_of[at] < 0) take_slot(a.chunk, a.microbatch, k - 1); // nothing received: the first stage
                plan.uses[std::size_t(use_of[at])].forward = k;
            } else {
                slot_use& u = plan.uses[std::size_t(use_of[at])];
                u.backward = k;
                free[std::size_t(a.chunk)].push_back(u.slot);
                if (gradient_of[at] >= 0) {
                    gradient_use& gu = plan.gradients[std::size_t(gradient_of[at])];
                    gu.backward = k;
                    gradient_free.push_back(gu.slot);
                }
            }
        }
        for (; g < program.groups.size() && program.groups[g].after == k; ++g)
            for (const p2p_op& op : program.groups[g].ops) {
                if (op.send) continue;
                const int chunk = s.chunk_of(op.m.stage);
                if (op.m.what == carries::activation) {
                    take_slot(chunk, op.m.microbatch, k);
                    continue;
                }
                int slot = plan.gradient_slots;
                if (next_gradient_free < gradient_free.size()) slot = gradient_free[next_gradient_free++];
                else ++plan.gradient_slots;
                gradient_of[std::size_t(chunk) * mbs + std::size_t(op.m.microbatch)] = int(plan.gradients.size());
                plan.gradients.push_back({chunk, op.m.microbatch, slot, k, -1});
            }
    }
    return plan;
}

} // namespace capscope::pipeline
