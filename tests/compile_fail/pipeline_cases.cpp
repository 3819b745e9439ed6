// Compile-fail cases of the pipeline schedule rules (capscope/pipeline/): PP1 (a count below its
// least), PP2 (layers that do not split over ranks x chunks), PP3 (several chunks per rank on a
// one-chunk schedule), PP4 (an interleaved group or count Megatron's schedule refuses), PP5
// (interleaved with one chunk per rank), PP6 (sends and receives that deadlock when replayed on
// the communicators chosen). As is, every valid twin must compile; with
// -DCASE_<ID>[__variant] the first error must read "capscope pipeline rule <ID>:" and say the fix
// (check.py).
#include <capscope/pipeline/pipeline_schedule.hpp>

using namespace capscope;
using pipeline::schedule_kind;
using pipeline::schedule_shape;

template <class Schedule>
int use() { return Schedule::program(0, Schedule::declared_microbatches[0]).rank; }

#if !defined(CAPSCOPE_ONE_CASE)
// The valid twins: Megatron's defaults (1F1B with fewer microbatches than ranks too), and an
// interleaved schedule paired pass by pass, whose shared communicator would deadlock, so per-edge
// ones are chosen.
int twins = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 4, .layers = 8}, 3, 8>>() +
            use<pipeline_schedule<schedule_shape{.kind = schedule_kind::gpipe, .ranks = 2, .layers = 2}, 1>>() +
            use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16}, 8, 12>>() +
            use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16,
                                                 .grouping = pipeline::p2p_grouping::paired}, 8, 12>>() +
            use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 2, .virtual_stages = 2, .layers = 4,
                                                 .communicators = pipeline::communicator_choice::per_edge}, 4>>();
#endif

#ifdef CASE_PP1
int pp1 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 1, .layers = 4}, 4>>();
#endif
#ifdef CASE_PP1__microbatches
int pp1 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 2, .layers = 4}, 0>>();
#endif
#ifdef CASE_PP2
int pp2 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 12}, 8>>();
#endif
#ifdef CASE_PP3
int pp3 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::one_f_one_b, .ranks = 4, .virtual_stages = 2, .layers = 8}, 8>>();
#endif
#ifdef CASE_PP4
int pp4 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16}, 8, 6>>();
#endif
#ifdef CASE_PP4__small_group
int pp4 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16, .group = 2}, 8>>();
#endif
#ifdef CASE_PP5
int pp5 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .layers = 8}, 8>>();
#endif
#ifdef CASE_PP6
int pp6 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 4, .virtual_stages = 2, .layers = 16,
                                               .communicators = pipeline::communicator_choice::shared, .grouping = pipeline::p2p_grouping::paired}, 8>>();
#endif
#ifdef CASE_PP6__send_buffer_wait
// Per edge the plain check completes, but a pass that computes a send waits for the edge's
// previous send (its buffer may be the same), and that closes a cycle: refused as issued.
int pp6 = use<pipeline_schedule<schedule_shape{.kind = schedule_kind::interleaved_1f1b, .ranks = 2, .virtual_stages = 2, .layers = 4, .group = 3,
                                               .grouping = pipeline::p2p_grouping::paired}, 6>>();
#endif
