#pragma once
//! @file
//! A 1F1B step cut into phases that do not depend on the microbatch count, so that graphs
//! captured once serve every count: the warmup (the rank's warmup forwards and the receive of its
//! first steady forward), a steady iteration (a forward, its paired sends and receives, a backward,
//! and theirs), replayed M - warmup - 1 times, and the tail (the last steady iteration and the
//! cooldown backwards).
//!
//! A graph replays fixed addresses, so a phase captured for one microbatch serves another only
//! where their buffers are the same. Here they are: the FIFO slot plan (activation_slots.hpp)
//! gives 1F1B's microbatch k the activation slot k mod S and the gradient slot k mod G on every
//! count, so steady iterations j and j + P, with P = lcm(S, G), are the same operations on the same
//! slots. Steady and tail phases therefore come in P variants, keyed by j mod P. The unit test checks,
//! over shapes and counts, that every phase of a count's program is its variant's phase up to
//! microbatch numbers congruent mod P, and that the phases together are the program. What changes
//! with the microbatch itself, such as which sample the first stage loads, must then be
//! device-valued: the first stage reads its data through a device counter, not a host index.

#include <capscope/pipeline/activation_slots.hpp>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::pipeline {

enum class phase_kind { warmup, steady, tail };

struct phase_key {
    phase_kind kind = phase_kind::warmup;
    int variant = 0; //!< steady and tail: the steady iteration's index mod the period
    friend constexpr bool operator==(const phase_key&, const phase_key&) = default;
};

//! What does not change with the microbatch count on one rank.
struct phase_layout {
    int warmup = 0;          //!< warmup forwards: ranks - rank - 1
    int activation_slots = 1; //!< S: microbatch k's activations live in slot k mod S
    int gradient_slots = 1;  //!< G: a received gradient of microbatch k lives in slot k mod G
    int period = 1;          //!< P = lcm(S, G): the variants of the steady and tail phases
    int least_microbatches = 2; //!< every rank runs a steady iteration: microbatches >= ranks
    constexpr int activation_slot(int microbatch) const { return microbatch % activation_slots; }
    constexpr int gradient_slot(int microbatch) const { return microbatch % gradient_slots; }
    //! The variant of steady iteration `j` (and of the tail whose last steady iteration is `j`):
    //! phases_of and the graphs' launch both key by it.
    constexpr int variant_of(int j) const { return j % period; }
};

//! One phase of a rank's program for a given count: its passes [first_pass, end_pass) of the
//! program's compute order, and the groups issued after them (the warmup also holds the groups
//! before the first pass). Group `after` indices are the program's.
struct phase_segment {
    phase_key key{};
    int first_pass = 0, end_pass = 0;
    std::vector<p2p_group> groups;
};

constexpr void require_phased(const schedule_shape& s, int rank) {
    if (s.kind != schedule_kind::one_f_one_b || s.grouping != p2p_grouping::megatron)
        throw std::invalid_argument("capscope pipeline: phases that serve every microbatch count are cut for 1f1b grouped as Megatron does "
                                    "(its steady state repeats); this schedule is " + std::string(name_of(s.kind)) +
                                    " -- fix: capture the whole step for each count, or use one_f_one_b");
    if (rank < 0 || rank >= s.ranks)
        throw std::invalid_argument("capscope pipeline: rank " + std::to_string(rank) + " is outside the schedule's " + std::to_string(s.ranks) + " ranks");
}

constexpr phase_layout phase_layout_of(const schedule_shape& s, int rank) {
    require_phased(s, rank);
    const slot_plan plan = plan_slots(s, rank, 2 * s.ranks + 2); // the counts are flat from ranks on
    phase_layout l;
    l.warmup = s.ranks - rank - 1;
    l.activation_slots = plan.slots[0];
    l.gradient_slots = plan.gradient_slots > 0 ? plan.gradient_slots : 1;
    l.period = std::lcm(l.activation_slots, l.gradient_slots);
    l.least_microbatches = s.ranks;
    return l;
}

//! The phases of rank `rank`'s program with `microbatches` microbatches, in issue order: warmup,
//! steady 0 .. R - 2, tail, where R = microbatches - warmup.
constexpr std::vector<phase_segment> phases_of(const schedule_shape& s, int rank, int microbatches) {
    const phase_layout l = phase_layout_of(s, rank);
    if (microbatches < l.least_microbatches)
        throw std::invalid_argument("capscope pipeline: phases that serve every count need every rank to run a steady iteration: " +
                                    std::to_string(microbatches) + " microbatches on " + std::to_string(s.ranks) +
                                    " ranks -- fix: at least as many microbatches as ranks, or capture the whole step for this count");
    const rank_program p = program_of(s, rank, microbatches);
    const int steady = microbatches - l.warmup; // R >= 1
    std::vector<phase_segment> out;
    out.push_back({{phase_kind::warmup, 0}, 0, l.warmup, {}});
    for (int j = 0; j + 1 < steady; ++j) out.push_back({{phase_kind::steady, l.variant_of(j)}, l.warmup + 2 * j, l.warmup + 2 * j + 2, {}});
    out.push_back({{phase_kind::tail, l.variant_of(steady - 1)}, l.warmup + 2 * (steady - 1), int(p.compute.size()), {}});
    std::size_t phase = 0;
    for (const p2p_group& g : p.groups) {
        // A group issued after pass a belongs to the phase holding a (before the first: the warmup).
        while (phase + 1 < out.size() && g.after >= out[phase].end_pass) ++phase;
        out[phase].groups.push_back(g);
    }
    return out;
}

//! A count whose program holds the phase `key` (for capturing it): the warmup's is the least
//! count; steady variant v needs v + 2 steady iterations; tail variant v, v + 1.
constexpr int count_holding(const schedule_shape& s, int rank, phase_key key) {
    const phase_layout l = phase_layout_of(s, rank);
    if (key.variant < 0 || key.variant >= l.period) throw std::out_of_range("capscope pipeline: a phase variant outside the period");
    // Rank 0 has the most warmup, so the least count serves it; later ranks run more steady iterations.
    switch (key.kind) {
    case phase_kind::warmup: return l.least_microbatches;
    case phase_kind::steady: return std::max(l.least_microbatches, l.warmup + key.variant + 2);
    case phase_kind::tail: {
        int m = l.warmup + key.variant + 1;
        while (m < l.least_microbatches) m += l.period; // keeps (m - warmup - 1) mod P
        return m;
    }
    }
    return l.least_microbatches;
}

namespace detail {

//! A phase in words with each microbatch taken mod the period: two phases with the same text
//! issue the same operations on the same slots.
inline std::string phase_text(const schedule_shape& s, int rank, const rank_program& p, const phase_segment& seg) {
    const int period = phase_layout_of(s, rank).period;
    std::string out;
    auto group_text = [&](const p2p_group& g) {
        for (const p2p_op& o : g.ops)
            out += std::string(o.send ? " s" : " r") + std::to_string(o.m.from) + ">" + std::to_string(o.m.to) +
                   (o.m.what == carries::activation ? "a" : "g") + std::to_string(o.m.stage) + "." + std::to_string(o.m.microbatch % period);
        out += " |";
    };
    for (const p2p_group& g : seg.groups)
        if (g.after < seg.first_pass) group_text(g);
    for (int k = seg.first_pass; k < seg.end_pass; ++k) {
        const compute_action& a = p.compute[std::size_t(k)];
        out += std::string(a.direction == pass::forward ? " F" : " B") + std::to_string(a.chunk) + "." + std::to_string(a.microbatch % period);
        for (const p2p_group& g : seg.groups)
            if (g.after == k) group_text(g);
    }
    return out;
}

} // namespace detail
} // namespace capscope::pipeline
