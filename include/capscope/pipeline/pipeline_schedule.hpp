#pragma once
//! @file
//! A pipeline schedule as a type: its shape, and the microbatch counts the trainer will run it
//! with. A shape that breaks a rule, or whose sends and receives would deadlock or cross when
//! replayed with one of those counts, does not compile; the error names the rule and the fix.
//!
//!     using schedule = capscope::pipeline_schedule<capscope::pipeline::schedule_shape{
//!         .kind = capscope::pipeline::schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16}, 8, 12, 16>;
//!     schedule::program(rank, 12);   // its passes and its groups of sends and receives
//!     schedule::slots(rank, 12);     // activation slots per chunk and received-gradient slots, each use's slot
//!     schedule::communicators;       // shared (grouped as Megatron does), or per_edge where a shared one would deadlock

#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <array>
#include <stdexcept>
#include <string>

namespace capscope {

namespace pipeline::detail {

template <auto...>
inline constexpr bool never = false;

template <schedule_shape S, int... M>
constexpr schedule_rule first_broken_rule() {
    if (const schedule_rule r = check_shape(S); r != schedule_rule::none) return r;
    schedule_rule first = schedule_rule::none;
    ((first = first == schedule_rule::none ? check_shape(S, M) : first), ...);
    return first;
}

//! The first declared count whose replay would not complete on the communicators chosen for all.
struct replay_failure {
    int microbatches = 0;
    communicator_layout layout = communicator_layout::shared;
    replay_verdict verdict{};
};
struct replay_outcome {
    communicator_layout layout = communicator_layout::shared; //!< for every declared count
    replay_failure failure{};
};
template <schedule_shape S, int... M>
constexpr replay_outcome replay_for_all() {
    auto first_failure = [](communicator_layout l) {
        replay_failure f{};
        auto one = [&](int m) {
            if (f.microbatches == 0)
                if (const replay_verdict v = check_as_issued(S, m, l); !v.completes()) f = {m, l, v};
        };
        (one(M), ...);
        return f;
    };
    if (S.communicators == communicator_choice::per_edge) return {communicator_layout::per_edge, first_failure(communicator_layout::per_edge)};
    const replay_failure on_shared = first_failure(communicator_layout::shared);
    if (S.communicators == communicator_choice::shared || on_shared.microbatches == 0) return {communicator_layout::shared, on_shared};
    return {communicator_layout::per_edge, first_failure(communicator_layout::per_edge)};
}

// One specialization per rule: only the first rule broken is reported.
template <schedule_rule R, schedule_shape S, int... M>
struct shape_rules_hold {};
template <schedule_shape S, int... M>
struct shape_rules_hold<schedule_rule::PP1, S, M...> {
    static_assert(never<S>, "capscope pipeline rule PP1: a pipeline schedule needs at least 2 ranks, 1 chunk per rank, 1 layer and 1 "
                            "microbatch, and no negative group -- fix: set ranks (--pipeline-model-parallel-size) to 2 or more and every "
                            "count to at least 1 (group 0 means the ranks)");
};
template <schedule_shape S, int... M>
struct shape_rules_hold<schedule_rule::PP2, S, M...> {
    static_assert(never<S>, "capscope pipeline rule PP2: the layers do not split evenly over ranks x chunks per rank (Megatron: "
                            "--num-layers divisible by --pipeline-model-parallel-size x virtual stages) -- fix: make layers a multiple of "
                            "ranks * virtual_stages (Megatron: virtual stages = --num-layers / (ranks x "
                            "--num-layers-per-virtual-pipeline-stage), or --num-virtual-stages-per-pipeline-rank)");
};
template <schedule_shape S, int... M>
struct shape_rules_hold<schedule_rule::PP3, S, M...> {
    static_assert(never<S>, "capscope pipeline rule PP3: gpipe and 1f1b run one chunk per rank, and this shape gives each rank more -- "
                            "fix: schedule_kind::interleaved_1f1b for several chunks per rank, or virtual_stages = 1");
};
template <schedule_shape S, int... M>
struct shape_rules_hold<schedule_rule::PP4, S, M...> {
    static_assert(never<S>, "capscope pipeline rule PP4: interleaved 1f1b takes the microbatches round the ranks in groups, chunk "
                            "by chunk; Megatron's schedule refuses a group smaller than the ranks (the ring's first rank would wait for "
                            "a chunk the ring has not reached: a deadlock), a group larger than the microbatches, and a last, partial "
                            "group smaller than the ranks -- fix: ranks <= group <= microbatches "
                            "(--microbatch-group-size-per-virtual-pipeline-stage, default the ranks), and microbatches % group either 0 "
                            "or at least the ranks");
};
template <schedule_shape S, int... M>
struct shape_rules_hold<schedule_rule::PP5, S, M...> {
    static_assert(never<S>, "capscope pipeline rule PP5: interleaved 1f1b with one chunk per rank is 1f1b -- fix: virtual_stages of 2 "
                            "or more (Megatron: --num-virtual-stages-per-pipeline-rank, or --num-layers-per-virtual-pipeline-stage "
                            "below layers / ranks), or schedule_kind::one_f_one_b");
};

template <replay_failure F>
struct replay_completes {};
template <replay_failure F>
    requires(F.microbatches != 0)
struct replay_completes<F> {
    static_assert(never<F>, "capscope pipeline rule PP6: replayed on its communicators, this schedule's sends and receives would "
                            "deadlock, take each other's data or go unmatched (the note names the microbatch count, the layout and the two "
                            "operations; per edge, a pass that computes a send waits for the edge's previous send) -- fix: "
                            "communicator_choice::automatic or per_edge (one communicator per directed rank edge and kind of traffic), "
                            "or grouped as Megatron groups them (p2p_grouping::megatron), or fewer microbatches in flight (a smaller "
                            "group); schedule::replay_report(microbatches) says it in words");
};

} // namespace pipeline::detail

template <pipeline::schedule_shape Shape, int... Microbatches>
struct pipeline_schedule : pipeline::detail::shape_rules_hold<pipeline::detail::first_broken_rule<Shape, Microbatches...>(), Shape, Microbatches...> {
    static constexpr pipeline::schedule_shape shape = Shape;
    //! The microbatch counts checked here; others are checked when a plan is made with them.
    static constexpr std::array<int, sizeof...(Microbatches)> declared_microbatches{Microbatches...};

private:
    static constexpr bool shape_holds = pipeline::detail::first_broken_rule<Shape, Microbatches...>() == pipeline::schedule_rule::none;
    // Replay is simulated only for a shape that keeps the rules (PP1-PP5 first).
    static constexpr pipeline::detail::replay_outcome replay =
        shape_holds ? pipeline::detail::replay_for_all<Shape, Microbatches...>() : pipeline::detail::replay_outcome{};
    [[no_unique_address]] pipeline::detail::replay_completes<replay.failure> replay_check_{};

public:
    //! The communicators for every declared count (automatic: shared where each completes on it).
    static constexpr pipeline::communicator_layout communicators = replay.layout;
    //! Rank `rank`'s passes and groups with `microbatches` microbatches. A count the type did not
    //! declare is checked here, against the rules and on the type's communicators, and refused
    //! with `std::invalid_argument` naming the rule (an undeclared count may need others).
    static pipeline::rank_program program(int rank, int microbatches) {
        require(microbatches);
        return pipeline::program_of(Shape, rank, microbatches);
    }
    static pipeline::slot_plan slots(int rank, int microbatches) {
        require(microbatches);
        return pipeline::plan_slots(Shape, rank, microbatches);
    }
    static std::string replay_report(int microbatches) { return describe(pipeline::check_as_issued(Shape, microbatches, communicators)); }

    static void require(int microbatches) {
        for (int declared : declared_microbatches)
            if (declared == microbatches) return;
        const std::string with = " with " + std::to_string(microbatches) + " microbatches";
        pipeline::require_rules(Shape, microbatches);
        if (const pipeline::replay_verdict v = pipeline::check_as_issued(Shape, microbatches, communicators); !v.completes())
            throw std::invalid_argument("capscope pipeline rule PP6" + with + ", on the " + std::string(pipeline::name_of(communicators)) +
                                        " communicators the type chose for its declared counts: " + describe(v) +
                                        " -- fix: declare the count in the type (pipeline_schedule<shape, ..., " + std::to_string(microbatches) +
                                        ">), which chooses the communicators for it too");
    }
};

} // namespace capscope
