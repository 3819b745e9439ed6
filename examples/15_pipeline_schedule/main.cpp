// Tutorial 15, the schedule: a pipeline schedule declared as a type, checked before anything runs.
// Host-only: it prints each rank's plan (its passes in Megatron's order, its activation slots, its
// groups of sends and receives), the communicators chosen for it, and what one shared
// communicator would do to an interleaved schedule paired pass by pass when a graph replays it.
//
//   15_pipeline_schedule [microbatches]      (default 8)
#include <capscope/pipeline.hpp>
#include <capscope/pipeline/schedule_text.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace capscope;
using pipeline::schedule_kind;
using pipeline::schedule_shape;

// [snippet schedules]
// Megatron's --pipeline-model-parallel-size 4, 8 layers: 1F1B, checked for 8 and 16 microbatches.
using plain = pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 4, .layers = 8}, 8, 16>;
// And --num-layers-per-virtual-pipeline-stage 2 on 16 layers: two chunks per rank.
using interleaved = pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16}, 8, 16>;
// The same, its sends and receives paired pass by pass instead of grouped as Megatron does.
using paired = pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16,
                                                .grouping = pipeline::p2p_grouping::paired}, 8, 16>;
static_assert(plain::communicators == pipeline::communicator_layout::shared);
static_assert(interleaved::communicators == pipeline::communicator_layout::shared); // one communicator, as Megatron's
static_assert(paired::communicators == pipeline::communicator_layout::per_edge);    // a shared one would deadlock
// [snippet schedules]

int main(int argc, char** argv) {
    const int microbatches = argc > 1 ? std::atoi(argv[1]) : 8;
    for (const schedule_shape& s : {plain::shape, interleaved::shape, paired::shape}) {
        if (const pipeline::schedule_rule r = pipeline::check_shape(s, microbatches); r != pipeline::schedule_rule::none) {
            std::printf("%s with %d microbatches: capscope pipeline rule %s\n", std::string(pipeline::name_of(s.kind)).c_str(), microbatches,
                        std::string(pipeline::rule_id(r)).c_str());
            return 2;
        }
        std::printf("%s\n", pipeline::schedule_text(s, microbatches).c_str());
    }
    // [snippet memory]
    // Memory by in-flight slots: the same for every microbatch count.
    for (int m : {8, 16, 32, 64}) {
        std::printf("%2d microbatches: rank 0 keeps", m);
        for (int chunk_slots : interleaved::slots(0, m).slots) std::printf(" %d", chunk_slots);
        std::printf(" activation slots per chunk (1f1b: %d)\n", plain::slots(0, m).slots[0]);
    }
    // [snippet memory]
    return 0;
}
