#pragma once
// Breakages on purpose, chosen at run time: the environment variable CAPSCOPE_BREAK names them
// (comma-separated), so a must-fail test is the same executable run with another environment,
// not another build. The library's own seam is capscope::detail::breakage; the rest are the
// tests' own.
//   drop_waits_from=NAME   the plan drops the derived waits for stages whose name contains NAME
//   ignore_guards          every guarded stage runs once, unconditionally
//   skip_rerun             a refused step stays refused
//   skip_in_place_replays  an in_place_runner launches no graph it has replayed before (its regions' work is lost)
//   skip_graph_updates     calls updated in the graph keep the values they were captured with
//   skip_replay_check      pipeline_p2p issues sends and receives that its replay check refused
//   drop_edge_waits        per edge, pipeline_p2p's passes do not wait for the edges their receives are on
//   one_phase_variant      pipeline_phase_graphs replays variant 0 of its steady and tail phases only
//   pass_graph_per_chunk   pipeline_pass_graphs replays one graph per chunk and direction, whatever the slot
//   keep_user_objects      runners instantiate their graphs as captured (launches of NCCL's wait past 28 in flight)
//   copy_kernels_as_empty  graphs copied without user objects get an empty node for each kernel
//   mem_op_waits_skipped   the kernel a copied graph runs for a memory-operation node leaves out its waits
//   first_event_record_kept  a copied graph keeps the first record of a chain of one event's, not the last
//   abort_parent_only      aborting a communicator leaves those split from it (a pipeline's edges) running
//   skip_replica_average   gpt::pipeline_model skips averaging its gradients over its pipeline replicas
//   recompute_forward_hooks  gpt::pipeline_model's recomputed forward runs the forward hooks as well
//   skip_pass_copy_back    gpt::pipeline_model's backward passes copy no offloaded tensor back to the device
//   skip_all_to_all_sum    all_reduce_as::all_to_all_then_all_gather sums nothing (each rank gathers its own part)
//   nccl_order_skipped     with NCCL_GRAPH_MIXING_SUPPORT=0, nccl_launch_order waits for nothing (NCCL's rules for graphs unkept)
//   first_microbatch_as_last  the plan calls first_microbatch_only stages (a kept gather) in the last microbatch
//   sum_for_average, drop_loss_scale_update, no_watchdog, no_doctor   (tests/gpu, tests/mpi)
// An unknown name ends the test with exit 99, which Meson reports as an error even where the
// test must fail: a typo may not pass for a breakage.

#include <capscope/detail/breakage.hpp>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

namespace breakage {

inline constexpr std::string_view test_own[] = {"sum_for_average", "drop_loss_scale_update", "no_watchdog", "no_doctor"};

inline std::set<std::string, std::less<>>& tests_broken() {
    static std::set<std::string, std::less<>> names;
    return names;
}

//! Whether the test's own breakage `name` is installed.
inline bool broken(std::string_view name) { return tests_broken().count(name) != 0; }

//! Reads CAPSCOPE_BREAK and installs what it names; call once, first thing in main.
inline void install_from_environment() {
    const char* text = std::getenv("CAPSCOPE_BREAK");
    if (!text || !*text) return;
    capscope::detail::breakage& library = capscope::detail::installed_breakage();
    std::string_view rest = text;
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        constexpr std::string_view drop = "drop_waits_from=";
        bool known = true;
        if (item.starts_with(drop) && item.size() > drop.size()) library.drop_waits_from = std::string(item.substr(drop.size()));
        else if (item == "ignore_guards") library.ignore_guards = true;
        else if (item == "skip_rerun") library.skip_rerun = true;
        else if (item == "skip_in_place_replays") library.skip_in_place_replays = true;
        else if (item == "skip_graph_updates") library.skip_graph_updates = true;
        else if (item == "skip_replay_check") library.skip_replay_check = true;
        else if (item == "drop_edge_waits") library.drop_edge_waits = true;
        else if (item == "one_phase_variant") library.one_phase_variant = true;
        else if (item == "pass_graph_per_chunk") library.pass_graph_per_chunk = true;
        else if (item == "keep_user_objects") library.keep_user_objects = true;
        else if (item == "copy_kernels_as_empty") library.copy_kernels_as_empty = true;
        else if (item == "mem_op_waits_skipped") library.mem_op_waits_skipped = true;
        else if (item == "first_event_record_kept") library.first_event_record_kept = true;
        else if (item == "abort_parent_only") library.abort_parent_only = true;
        else if (item == "skip_replica_average") library.skip_replica_average = true;
        else if (item == "recompute_forward_hooks") library.recompute_forward_hooks = true;
        else if (item == "skip_pass_copy_back") library.skip_pass_copy_back = true;
        else if (item == "skip_all_to_all_sum") library.skip_all_to_all_sum = true;
        else if (item == "nccl_order_skipped") library.nccl_order_skipped = true;
        else if (item == "first_microbatch_as_last") library.first_microbatch_as_last = true;
        else {
            known = false;
            for (std::string_view own : test_own)
                if (item == own) known = true, tests_broken().emplace(item);
        }
        if (!known) {
            std::fprintf(stderr, "CAPSCOPE_BREAK names '%.*s', which is no breakage -- fix: drop_waits_from=NAME, ignore_guards, skip_rerun, skip_in_place_replays, skip_graph_updates, "
                                 "skip_replay_check, drop_edge_waits, one_phase_variant, pass_graph_per_chunk, keep_user_objects, copy_kernels_as_empty, mem_op_waits_skipped, first_event_record_kept, abort_parent_only, skip_replica_average, recompute_forward_hooks, skip_pass_copy_back, skip_all_to_all_sum, nccl_order_skipped, first_microbatch_as_last, sum_for_average, drop_loss_scale_update, no_watchdog or no_doctor\n", int(item.size()), item.data());
            std::exit(99);
        }
    }
    std::fprintf(stderr, "broken on purpose (CAPSCOPE_BREAK=%s)\n", text);
}

} // namespace breakage
