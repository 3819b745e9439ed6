#pragma once
//! @file
//! A schedule's plan per rank, in words: its passes in order, its warmup, its activation slots
//! per chunk, its groups of sends and receives, the communicators chosen and why, and the bubble
//! the schedule leaves in theory.

#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <cstdio>
#include <string>

namespace capscope::pipeline {

//! The idle fraction of a step in theory: (p - 1) / (m + p - 1), and (p - 1) / (v m + p - 1)
//! interleaved (Megatron's paper); GPipe's and 1F1B's are the same, their memory is not.
constexpr double theoretical_bubble(const schedule_shape& s, int microbatches) {
    const int v = s.kind == schedule_kind::interleaved_1f1b ? s.virtual_stages : 1;
    return double(s.ranks - 1) / double(v * microbatches + s.ranks - 1);
}

inline std::string schedule_text(const schedule_shape& s, int microbatches) {
    std::string out = std::string(name_of(s.kind)) + " schedule: " + std::to_string(s.ranks) + " ranks";
    if (s.virtual_stages > 1) out += " x " + std::to_string(s.virtual_stages) + " chunks";
    out += ", " + std::to_string(s.layers_per_chunk()) + " layers a chunk, " + std::to_string(microbatches) + " microbatches";
    if (s.kind == schedule_kind::interleaved_1f1b) out += " in groups of " + std::to_string(s.group_size());
    out += ", sends and receives grouped " + std::string(s.grouping == p2p_grouping::megatron ? "as Megatron does" : name_of(s.grouping));
    char bubble[32];
    std::snprintf(bubble, sizeof bubble, "%.1f%%", 100.0 * theoretical_bubble(s, microbatches));
    out += "; bubble in theory " + std::string(bubble) + "\n";
    const communicator_plan c = choose_communicators(s, microbatches); // this count's own choice
    out += "  communicators: " + std::string(name_of(c.layout));
    if (c.layout == communicator_layout::per_edge && s.communicators == communicator_choice::automatic)
        out += " (one per directed rank edge and kind of traffic; on one shared communicator, " + describe(check_replay(s, microbatches, communicator_layout::shared)) + ")";
    if (!c.verdict.completes()) out += ": " + describe(c.verdict);
    out += "\n";
    for (int r = 0; r < s.ranks; ++r) {
        const std::vector<compute_action> order = compute_order(s, r, microbatches);
        const slot_plan slots = plan_slots(s, r, microbatches);
        out += "  rank " + std::to_string(r) + ": warmup " + std::to_string(warmup_forwards(s, r, microbatches)) + ", slots";
        for (int n : slots.slots) out += " " + std::to_string(n);
        out += ", " + std::to_string(program_of(s, r, microbatches).groups.size()) + " groups; passes:";
        for (const compute_action& a : order)
            out += std::string(" ") + (a.direction == pass::forward ? "F" : "B") + (s.virtual_stages > 1 ? std::to_string(a.chunk) + "." : "") +
                   std::to_string(a.microbatch);
        out += "\n";
    }
    return out;
}

} // namespace capscope::pipeline
