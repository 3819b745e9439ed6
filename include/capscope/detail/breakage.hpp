#pragma once
//! @file
//! The one seam through which tests break the engine on purpose, to watch a test go red without
//! a derived wait, a guard or a rerun. Nothing in the library sets it, so a user's program leaves
//! it empty; only the test suites install it (tests/gpu/breakage.hpp, from CAPSCOPE_BREAK).
//! It is read while a plan is made and while a runner binds its calls; `skip_graph_updates` once
//! per replay that has updates (one load).

#include <string>

namespace capscope::detail {

struct breakage {
    //! Drop every derived wait for calls of stages whose name contains this, and report what the
    //! verifier then finds instead of refusing the plan.
    std::string drop_waits_from;
    bool ignore_guards = false; //!< every guarded stage runs once, unconditionally
    bool skip_rerun = false;    //!< a refused step stays refused
    bool skip_in_place_replays = false; //!< an in_place_runner launches no captured graph after its first (a no-op replay)
    bool skip_graph_updates = false;    //!< calls updated in the graph keep the values of their capture
    bool skip_replay_check = false;     //!< pipeline_p2p issues sends and receives its replay check refused
    bool drop_edge_waits = false;       //!< per edge, pipeline_p2p's passes do not wait for their receives' edges
    bool one_phase_variant = false;     //!< pipeline_phase_graphs replays steady and tail variant 0 whatever the iteration (wrong slots)
    bool pass_graph_per_chunk = false;  //!< pipeline_pass_graphs keys a pass by chunk and direction only (one slot's graph for every microbatch)
    bool keep_user_objects = false;     //!< runners instantiate their graphs as captured, user objects and all (launches wait past 28)
    bool copy_kernels_as_empty = false; //!< without_user_objects copies each kernel node as an empty node (the copy computes nothing)
    bool keep_mem_op_nodes = false;     //!< without_user_objects copies memory-operation nodes as they are (a comparison: their launch cost)
    bool mem_op_waits_skipped = false;  //!< the kernel that replaces a memory-operation node leaves out its waits
    bool keep_event_records = false;    //!< without_user_objects copies every event record node as it is (a comparison: their launch cost)
    bool first_event_record_kept = false; //!< without_user_objects keeps the first record of a chain of one event's, not the last
    bool abort_parent_only = false;     //!< nccl_communicator::abort leaves the communicators split from it running
    bool skip_replica_average = false;  //!< gpt::pipeline_model does not average its gradients over its replicas
    bool recompute_forward_hooks = false; //!< gpt::pipeline_model's recomputed forward runs the forward hooks too
    bool skip_pass_copy_back = false;     //!< gpt::pipeline_model's backward passes copy no offloaded tensor back
    bool first_microbatch_as_last = false; //!< the plan calls first_microbatch_only stages in the last microbatch instead
    bool skip_all_to_all_sum = false;     //!< all_reduce_as::all_to_all_then_all_gather sums nothing: each rank gathers its own part
    bool nccl_order_skipped = false;      //!< nccl_launch_order keeps none of NCCL's rules for graphs without graph mixing
};

inline breakage installed_breakage_v{};

//! What the tests installed; empty in every other program.
inline breakage& installed_breakage() noexcept { return installed_breakage_v; }

} // namespace capscope::detail
