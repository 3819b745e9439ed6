#pragma once
//! @file
//! What a runner did, counted as it goes: the tutorials print these, and the tests check them.
//! Counters saturate at their largest value instead of wrapping.

#include <limits>

namespace capscope {

struct runner_counters {
    long steps = 0;              //!< training steps run (inference: forwards run)
    long captures = 0;           //!< segments captured into graphs
    long instantiations = 0;     //!< executable graphs instantiated
    long replays = 0;            //!< graph launches
    long eager_segment_runs = 0; //!< eager islands run (during warmup every segment is one)
    long capture_failures = 0;   //!< captures that failed (then raised, or fell back to eager)
    long exec_updates = 0;       //!< executable graphs updated in place (cudaGraphExecUpdate) instead of instantiated
    long update_refusals = 0;    //!< updates CUDA refused (other topology): instantiated anew, counted in instantiations too
    long oversize_runs = 0;      //!< inference: requests past the largest bucket run eagerly
    long conditional_nodes = 0;  //!< conditional nodes captured (a run of guarded stages each)
    long guard_reads = 0;        //!< eager: a guard's flag read on the host (once per IF, once per WHILE pass and at its end)
    long reruns = 0;             //!< steps refused on the device (training_program::rerun) and run again eagerly
    long doctor_calls_watched = 0; //!< stage calls the capture doctor watched in the last warmup step (0: it did not watch)
    long graph_updates = 0;   //!< calls updated in the graph (stage::updated_in_graph): recorded again and put in place before a replay
    long update_fallbacks = 0; //!< replays whose update the graph could not take, run eagerly instead (capture_failure::run_eagerly)
    long user_object_copies = 0; //!< graphs copied without their user objects before instantiation (cuda/graph_copy.hpp), so that launches of graphs holding NCCL do not wait
    long copies_refused = 0;     //!< graphs kept as captured, holding a node the copy does not take (a conditional node): their launches may wait past 28 in flight
    long mem_op_kernels = 0;     //!< memory-operation nodes (NCCL's copy-engine collectives) that copied graphs run as a kernel (cuda/mem_op_kernel.hpp)
    long mem_op_nodes_kept = 0;  //!< memory-operation nodes copied graphs keep, whose work CUDA does on the host at every launch
    long event_records_dropped = 0; //!< event records copied graphs run as empty nodes, a later record of the event standing for each (NCCL's, cuda/graph_event_records.hpp)
    // Start-up, in host microseconds (set-up only: never on the replay path).
    long capture_us = 0;             //!< capturing segments into graphs, all of them
    long instantiate_us = 0;         //!< instantiating (or updating) executable graphs, all of them
    long longest_capture_us = 0;     //!< the longest single capture
    long longest_instantiate_us = 0; //!< the longest single instantiation or update
    // On the replay path, for stages updated in the graph only (host microseconds).
    long update_us = 0;              //!< recording and putting in place the calls updated in the graph, all of them
    long longest_update_us = 0;      //!< the longest single update (a replay's, or in place one region's)
    friend constexpr bool operator==(const runner_counters&, const runner_counters&) = default;
};

namespace detail {
//! Adds one, saturating.
constexpr void count_one(long& counter) noexcept {
    if (counter < std::numeric_limits<long>::max()) ++counter;
}
//! Adds `us` to `total` (saturating) and keeps the longest in `longest`.
constexpr void add_time(long& total, long& longest, long us) noexcept {
    total = total > std::numeric_limits<long>::max() - us ? std::numeric_limits<long>::max() : total + us;
    if (us > longest) longest = us;
}
} // namespace detail

} // namespace capscope
