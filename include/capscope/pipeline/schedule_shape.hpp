#pragma once
//! @file
//! What a pipeline schedule is: its kind, the ranks it spans, the model chunks (virtual stages)
//! each rank holds, the layers they split, and Megatron's microbatch grouping. The rules a
//! shape must keep (PP1-PP6) are checked here, in constant expressions as at run time; the
//! microbatch count is a run-time value, so the rules that need it take it apart.
//!
//! Megatron's names: `--pipeline-model-parallel-size` (ranks), `--num-layers-per-virtual-
//! pipeline-stage` (layers / (ranks * virtual_stages)), `--microbatch-group-size-per-virtual-
//! pipeline-stage` (group, default the ranks).

#include <stdexcept>
#include <string>
#include <string_view>

namespace capscope::pipeline {

enum class schedule_kind {
    gpipe,            //!< every forward, then every backward: in-flight activations grow with the microbatches
    one_f_one_b,      //!< warmup forwards, then one forward and one backward in turn (Megatron's default)
    interleaved_1f1b, //!< 1F1B over several model chunks per rank (Megatron's virtual pipeline)
};

constexpr std::string_view name_of(schedule_kind k) {
    switch (k) {
    case schedule_kind::gpipe: return "gpipe";
    case schedule_kind::one_f_one_b: return "1f1b";
    case schedule_kind::interleaved_1f1b: return "interleaved 1f1b";
    }
    return "?";
}

//! Which communicators carry a schedule's sends and receives (replay_check.hpp says why it matters).
enum class communicator_choice {
    automatic, //!< one shared communicator where replay completes on it, else one per directed rank edge and kind of traffic
    shared,    //!< one for all of a rank's sends and receives
    per_edge,  //!< one per directed rank-to-rank edge and kind of traffic (activations, gradients)
};

//! How a rank's sends and receives are grouped:
//! - paired: before each pass, the previous pass's sends with this pass's receives (Megatron's
//!   1F1B steady state, `send_forward_recv_backward` and the like), in one group;
//! - one_by_one: the same operations in the same order, each alone (PyTorch's eager pipelining
//!   before its batched operations);
//! - megatron: as Megatron-LM's schedules.py issues them without p2p overlap. 1F1B: warmup and
//!   cooldown operations alone, the steady state paired. Interleaved: each receive posted one
//!   step ahead (the first rank receives the ring's activations, and the last rank its
//!   gradients, ranks - 1 steps late, and keeps them until their pass), and in the steady state
//!   one group of up to four operations after each forward and backward pair. GPipe: paired.
enum class p2p_grouping { paired, one_by_one, megatron };

constexpr std::string_view name_of(p2p_grouping g) {
    return g == p2p_grouping::paired ? "paired" : g == p2p_grouping::one_by_one ? "one by one" : "megatron";
}

struct schedule_shape {
    schedule_kind kind = schedule_kind::one_f_one_b;
    int ranks = 2;          //!< pipeline ranks (stages of the non-interleaved schedules)
    int virtual_stages = 1; //!< model chunks per rank; chunk c of rank r is virtual stage c * ranks + r
    int layers = 2;         //!< the model's layers, split evenly over the ranks * virtual_stages chunks
    int group = 0;          //!< interleaved: forwards of one chunk before the next chunk's (0: ranks)
    communicator_choice communicators = communicator_choice::automatic;
    p2p_grouping grouping = p2p_grouping::megatron; //!< how its sends and receives are grouped (p2p_program.hpp)

    constexpr int group_size() const { return group > 0 ? group : ranks; }
    constexpr int stages() const { return ranks * virtual_stages; }
    constexpr int layers_per_chunk() const { return layers / stages(); }
    //! The virtual stage of rank `r`'s chunk `c`, and back.
    constexpr int stage_of(int rank, int chunk) const { return chunk * ranks + rank; }
    constexpr int rank_of(int stage) const { return stage % ranks; }
    constexpr int chunk_of(int stage) const { return stage / ranks; }
    friend constexpr bool operator==(const schedule_shape&, const schedule_shape&) = default;
};

//! The rules, in the order they are checked. PP6 (sends and receives that would deadlock or cross
//! when replayed on the communicators chosen) is the replay check's (replay_check.hpp).
//! 1F1B with fewer microbatches than ranks is accepted, as Megatron accepts it: every rank still
//! runs 1F1B's order, and its replay completes.
enum class schedule_rule {
    none,
    PP1, //!< a count below its least: ranks < 2, virtual stages < 1, layers < 1, group < 0, microbatches < 1
    PP2, //!< layers not divisible by ranks * virtual stages
    PP3, //!< more than one chunk per rank on a schedule that runs one (gpipe, 1f1b)
    PP4, //!< interleaved with a group or a microbatch count Megatron's schedule refuses
    PP5, //!< interleaved with one chunk per rank
};

constexpr std::string_view rule_id(schedule_rule r) {
    constexpr std::string_view ids[] = {"", "PP1", "PP2", "PP3", "PP4", "PP5"};
    return ids[int(r)];
}

//! What a rule refuses and its fix, in words (the compile-time messages say it at more length).
constexpr std::string_view describe(schedule_rule r) {
    switch (r) {
    case schedule_rule::none: return "";
    case schedule_rule::PP1: return "a count below its least (ranks < 2, chunks, layers or microbatches < 1, group < 0) -- fix: counts of at least 1, two ranks or more";
    case schedule_rule::PP2: return "layers that do not split evenly over ranks x chunks -- fix: layers a multiple of ranks * virtual_stages";
    case schedule_rule::PP3: return "more than one chunk per rank on gpipe or 1f1b -- fix: interleaved_1f1b, or virtual_stages = 1";
    case schedule_rule::PP4:
        return "interleaved with a group smaller than the ranks or larger than the microbatches, or a last, partial group smaller than the ranks -- fix: "
               "ranks <= group <= microbatches, and microbatches % group either 0 or at least the ranks";
    case schedule_rule::PP5: return "interleaved with one chunk per rank -- fix: virtual_stages of 2 or more, or one_f_one_b";
    }
    return "";
}

//! The first rule the shape breaks, whatever the microbatch count.
constexpr schedule_rule check_shape(const schedule_shape& s) {
    if (s.ranks < 2 || s.virtual_stages < 1 || s.layers < 1 || s.group < 0) return schedule_rule::PP1;
    if (s.layers % s.stages() != 0) return schedule_rule::PP2;
    if (s.kind != schedule_kind::interleaved_1f1b && s.virtual_stages != 1) return schedule_rule::PP3;
    if (s.kind == schedule_kind::interleaved_1f1b && s.virtual_stages < 2) return schedule_rule::PP5;
    if (s.kind == schedule_kind::interleaved_1f1b && s.group_size() < s.ranks) return schedule_rule::PP4; // no count can mend it
    return schedule_rule::none;
}

//! The first rule the shape breaks with `microbatches` microbatches in a step.
constexpr schedule_rule check_shape(const schedule_shape& s, int microbatches) {
    if (const schedule_rule r = check_shape(s); r != schedule_rule::none) return r;
    if (microbatches < 1) return schedule_rule::PP1;
    // Megatron's interleaved schedule (schedules.py) takes the microbatches round the ring in
    // groups, chunk by chunk, and refuses a group larger than the microbatches, and a last,
    // partial group smaller than the ranks ("dependency bubbles"). (A group smaller than the
    // ranks, refused above, leaves the ring's first rank waiting for a chunk the ring has not
    // reached: a deadlock on any communicators.)
    if (s.kind == schedule_kind::interleaved_1f1b) {
        const int g = s.group_size(), rest = microbatches % g;
        if (g > microbatches || (rest != 0 && rest < s.ranks)) return schedule_rule::PP4;
    }
    return schedule_rule::none;
}

//! Throws `std::invalid_argument` naming the first rule the shape breaks with `microbatches`
//! microbatches, and its fix (for counts checked at run time).
inline void require_rules(const schedule_shape& s, int microbatches) {
    if (const schedule_rule r = check_shape(s, microbatches); r != schedule_rule::none)
        throw std::invalid_argument("capscope pipeline rule " + std::string(rule_id(r)) + " with " + std::to_string(microbatches) +
                                    " microbatches: " + std::string(describe(r)));
}

} // namespace capscope::pipeline
