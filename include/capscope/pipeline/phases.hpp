#pragma once
//! @file
//! A 1F1B or interleaved 1F1B step cut into phases that do not depend on the microbatch count, so that graphs
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

#include <algorithm>
#include <numeric>
#include <utility>
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
//!
//! Slots: a chunk's microbatches arrive in order and are freed in order (its forwards, and its
//! backwards, run in microbatch order), so the ones alive at once are consecutive, and microbatch
//! k of chunk c can live in slot k mod S_c, S_c being the most alive at once. Received gradients
//! likewise, per chunk, in one pool (chunk c's at offset G_0 + ... + G_{c-1}).
//!
//! Period: interleaved, the passes go through the chunks in groups of `group` microbatches, so
//! iteration j + chunks x Q repeats iteration j with microbatches Q later, Q being a multiple of
//! the group and of every slot count; on the same slots, then. 1F1B is the case of one chunk and a
//! group of one.
struct phase_layout {
    int warmup = 0;          //!< warmup forwards (Megatron's)
    int chunks = 1;          //!< model chunks on the rank
    int group = 1;           //!< interleaved: microbatches a group goes through each chunk with; 1F1B: 1
    int activation_slots = 1; //!< S_0: chunk 0's slots (1F1B: the rank's)
    int gradient_slots = 1;  //!< every chunk's received-gradient slots together
    int microbatch_period = 1; //!< Q: microbatches k and k + Q use the same slots
    int period = 1;          //!< P = chunks x Q: the variants of the steady phases
    int least_microbatches = 2; //!< the least count the phases serve
    std::vector<int> chunk_slots;     //!< S_c
    std::vector<int> chunk_gradients; //!< G_c
    std::vector<int> gradient_offset; //!< where chunk c's gradient slots start
    constexpr int activation_slot(int chunk, int microbatch) const { return microbatch % chunk_slots[std::size_t(chunk)]; }
    constexpr int gradient_slot(int chunk, int microbatch) const {
        return gradient_offset[std::size_t(chunk)] + microbatch % chunk_gradients[std::size_t(chunk)];
    }
    constexpr int activation_slot(int microbatch) const { return activation_slot(0, microbatch); }
    constexpr int gradient_slot(int microbatch) const { return gradient_slot(0, microbatch); }
    //! The variant of steady iteration `j` (and of the tail whose last steady iteration is `j`):
    //! phases_of and the graphs' launch both key by it.
    constexpr int variant_of(int j) const { return j % period; }
    //! Whether the phases serve `microbatches` (at least the least count; interleaved, whole groups).
    constexpr bool serves(int microbatches) const { return microbatches >= least_microbatches && microbatches % group == 0; }
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
    if (s.kind == schedule_kind::gpipe || s.grouping != p2p_grouping::megatron)
        throw std::invalid_argument("capscope pipeline: phases that serve every microbatch count are cut for 1f1b and interleaved 1f1b "
                                    "grouped as Megatron does (their steady state repeats); this schedule is " + std::string(name_of(s.kind)) +
                                    (s.grouping != p2p_grouping::megatron ? ", grouped otherwise" : "") +
                                    " -- fix: capture the whole step for each count, or use one_f_one_b or interleaved_1f1b with p2p_grouping::megatron");
    if (rank < 0 || rank >= s.ranks)
        throw std::invalid_argument("capscope pipeline: rank " + std::to_string(rank) + " is outside the schedule's " + std::to_string(s.ranks) + " ranks");
}

namespace detail {
//! The most of one chunk's intervals [from, to] alive at once.
constexpr int most_alive(std::vector<std::pair<int, int>> spans) {
    int most = 0;
    for (const auto& [from, to] : spans) {
        int alive = 0;
        for (const auto& [f, t] : spans) alive += f <= from && from < t ? 1 : 0; // one freed by a backward at `from` is free after it
        most = std::max(most, alive);
    }
    return most;
}
} // namespace detail

constexpr phase_layout phase_layout_of(const schedule_shape& s, int rank) {
    require_phased(s, rank);
    phase_layout l;
    l.chunks = s.virtual_stages;
    const bool looped = s.kind == schedule_kind::interleaved_1f1b;
    l.group = looped ? s.group_size() : 1;
    const int forwards_per_table = l.chunks * l.group;
    l.warmup = looped ? (s.ranks - rank - 1) * 2 + (l.chunks - 1) * l.group : s.ranks - rank - 1;
    // The least count: whole groups, and a full table of steady iterations after the warmup.
    // (1F1B: the ranks, so that every rank runs a steady iteration.) Interleaved, from rank 0's
    // warmup, the longest, so that every rank serves the same counts: a count served on one rank
    // and refused on another would leave the first waiting in its sends.
    const int first_warmup = looped ? (s.ranks - 1) * 2 + (l.chunks - 1) * l.group : 0;
    int least = looped ? l.group : s.ranks;
    while (looped && (l.chunks * least < first_warmup + forwards_per_table + 1 || least < s.ranks)) least += l.group;
    l.least_microbatches = least;
    // The slots a chunk needs, from a count well past the least (the counts are flat from there).
    const int reference = least + 2 * l.group * (s.ranks + 1);
    const slot_plan plan = plan_slots(s, rank, reference);
    l.chunk_slots.assign(std::size_t(l.chunks), 1);
    l.chunk_gradients.assign(std::size_t(l.chunks), 1);
    l.gradient_offset.assign(std::size_t(l.chunks), 0);
    for (int c = 0; c < l.chunks; ++c) {
        std::vector<std::pair<int, int>> acts, grads;
        for (const slot_use& u : plan.uses)
            if (u.chunk == c) acts.emplace_back(u.received, u.backward);
        for (const gradient_use& u : plan.gradients)
            if (u.chunk == c) grads.emplace_back(u.received, u.backward);
        l.chunk_slots[std::size_t(c)] = std::max(1, detail::most_alive(acts));
        l.chunk_gradients[std::size_t(c)] = std::max(1, detail::most_alive(grads));
    }
    // Interleaved, a count is rounded up to a multiple of the group (or to a divisor of it, when
    // smaller), so that the period stays a few groups long: the memory of a few slots, against
    // as many graphs as the period has iterations.
    auto fitted = [&](int count) {
        if (!looped || count % l.group == 0) return count;
        if (count > l.group) return (count + l.group - 1) / l.group * l.group;
        int d = count;
        while (l.group % d != 0) ++d;
        return d;
    };
    for (int c = 0; c < l.chunks; ++c) {
        l.chunk_slots[std::size_t(c)] = fitted(l.chunk_slots[std::size_t(c)]);
        l.chunk_gradients[std::size_t(c)] = fitted(l.chunk_gradients[std::size_t(c)]);
    }
    int q = l.group, offset = 0;
    for (int c = 0; c < l.chunks; ++c) {
        q = std::lcm(q, std::lcm(l.chunk_slots[std::size_t(c)], l.chunk_gradients[std::size_t(c)]));
        l.gradient_offset[std::size_t(c)] = offset;
        offset += l.chunk_gradients[std::size_t(c)];
    }
    l.activation_slots = l.chunk_slots[0];
    l.gradient_slots = offset;
    l.microbatch_period = q;
    l.period = l.chunks * q;
    return l;
}

//! The phases of rank `rank`'s program with `microbatches` microbatches, in issue order: warmup,
//! steady 0 .. R - 2, tail, where R = chunks x microbatches - warmup.
constexpr std::vector<phase_segment> phases_of(const schedule_shape& s, int rank, int microbatches) {
    const phase_layout l = phase_layout_of(s, rank);
    if (!l.serves(microbatches))
        throw std::invalid_argument("capscope pipeline: the phases that serve every count need at least " + std::to_string(l.least_microbatches) +
                                    " microbatches" + (l.group > 1 ? " in whole groups of " + std::to_string(l.group) : std::string()) +
                                    " on rank " + std::to_string(rank) + ", and this count is " + std::to_string(microbatches) +
                                    " -- fix: at least " + std::to_string(l.least_microbatches) + " microbatches" + (l.group > 1 ? " in whole groups," : std::string()) +
                                    " or capture the whole step for this count");
    const rank_program p = program_of(s, rank, microbatches);
    const int steady = l.chunks * microbatches - l.warmup; // R >= 1
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

//! A count whose program holds the phase `key` (for capturing it), or 0 when no count does: the
//! warmup's is the least count; steady variant v needs v + 2 steady iterations; tail variant v,
//! a count whose last steady iteration is v mod the period (interleaved, whole groups reach only
//! some of them).
constexpr int count_holding(const schedule_shape& s, int rank, phase_key key) {
    const phase_layout l = phase_layout_of(s, rank);
    if (key.variant < 0 || key.variant >= l.period) throw std::out_of_range("capscope pipeline: a phase variant outside the period");
    if (key.kind == phase_kind::warmup) return l.least_microbatches;
    for (int m = l.least_microbatches;; m += l.group) {
        const int last = l.chunks * m - l.warmup - 1; // the last steady iteration
        if (key.kind == phase_kind::steady && last > key.variant) return m;
        if (key.kind == phase_kind::tail && l.variant_of(last) == key.variant) return m;
        if (key.kind == phase_kind::tail && m >= l.least_microbatches + l.microbatch_period) return 0; // every residue tried
    }
}

namespace detail {

//! A phase in words with each microbatch taken mod the period: two phases with the same text
//! issue the same operations on the same slots.
inline std::string phase_text(const schedule_shape& s, int rank, const rank_program& p, const phase_segment& seg) {
    const int period = phase_layout_of(s, rank).microbatch_period;
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
