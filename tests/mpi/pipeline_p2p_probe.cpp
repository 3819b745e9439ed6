// A pipeline step with its sends and receives captured inside one graph, on every rank of an MPI
// job (one process per GPU): 1F1B, GPipe and interleaved 1F1B (two chunks per rank, groups of the
// ranks and of one more), each stage y = x * w + 1/4, trained a few steps three ways that must
// agree bit for bit:
// - eager: the rank's program (capscope/parallel/pipeline_p2p.hpp) issued step by step;
// - graph: one eager step (NCCL opens its connections on the first send), then the whole step,
//   sends, receives and the optimizer included, captured once and replayed;
// - the CPU: the same microbatches through every stage in turn, the same float operations;
// and two more that must equal eager: `local` and `transformer_engine`, each pass replayed from a
// graph per chunk, direction and slot (pipeline_pass_graphs), the sends and receives eager.
// Activations wait in slots (pipeline::plan_slots), received gradients too: memory by in-flight
// microbatches. Sends and receives are grouped as Megatron groups them, on one communicator.
// Then 1F1B with the count cycling 8 -> 12 -> 16 every step for 100 steps, and interleaved 1F1B
// (two chunks a rank) with counts in whole groups, from graphs captured once
// (pipeline_phase_graphs), each launch after a random delay on each rank.
//
//   pipeline_p2p_probe gpus                    prints the usable GPU count
//   pipeline_p2p_probe [--floats N] [--steps T] [--microbatches M] [--kind 1f1b|gpipe|interleaved 1f1b|1f1b phases|interleaved phases] [--grouping megatron|paired|one_by_one]
//                      [--phase-steps T] [--delay-us D] [--stop-rank R]
//       --stop-rank R: rank R stops taking part before the phased case's step 5; the other
//       ranks' watchdog (cuda::nccl_watchdog) must end the job. With --grouping one_by_one (1F1B)
//       or paired (interleaved): a communicator per edge, whole-step graphs, and a watchdog with a fault
//       handler that keeps the process: aborting the world's communicator must free the edges'
//       exit 0 when every case agrees, 1 when one differs, 77 with one rank; under
//       CAPSCOPE_BREAK=skip_replay_check with --grouping one_by_one, sends and receives the replay
//       check refuses are issued anyway, on one communicator (does the hang it predicts happen?)
//       --grouping paired or one_by_one: the groupings that would not complete on one
//       communicator run on a communicator per edge (pipeline_p2p's choice), and must agree too

#include "../gpu/breakage.hpp"
#include "../gpu/mpi_support.hpp"
#include "../../examples/common/pipeline_kernels.hpp"
#include "pipeline_stage.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/nccl_watchdog.hpp>
#include <capscope/parallel/pipeline_pass_graphs.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <capscope/pipeline/activation_slots.hpp>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

using namespace capscope;
using pipeline::compute_action;
using pipeline::pass;

namespace {

using namespace pipeline_model;

bool all_ranks(bool mine) {
    int ok = mine ? 1 : 0, all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all == 1;
}

bool run_case(const pipeline::schedule_shape& shape, int microbatches, int steps, int n) {
    const int ranks = support::comm().size(), rank = support::comm().rank();
    cuda::stream s;
    // A case the replay check refuses (PP6: it would hang on the communicators it would get) is
    // said, on every rank alike, before anything is sent, and is not run.
    std::optional<pipeline_p2p> checked;
    try {
        checked.emplace(support::comm(), shape, microbatches);
    } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).find("rule PP6") == std::string::npos) throw;
        if (rank == 0)
            std::printf("rank 0, %s, %d ranks, %d microbatches in groups of %d: refused before anything is sent: %s\n",
                        std::string(pipeline::name_of(shape.kind)).c_str(), ranks, microbatches, shape.group_size(), e.what());
        return true;
    }
    const pipeline_p2p& p2p = *checked;
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, microbatches);
    const int chunks = shape.virtual_stages;
    stage_state eager(n, rank, ranks, chunks, plan, microbatches, s), graphed(n, rank, ranks, chunks, plan, microbatches, s);
    for (int t = 0; t < steps; ++t) eager.step(p2p, s);
    graphed.step(p2p, s); // NCCL opens its connections on the first send: eagerly, before the capture
    const cuda::graph g = cuda::capture(s, [&](cudaStream_t on) { graphed.step(p2p, on); });
    const cuda::graph_exec exec(g);
    for (int t = 1; t < steps; ++t) exec.launch(s);
    // local and transformer_engine: each pass a graph (per chunk, direction and slot), the sends
    // and receives eager between them; captured at first use, or all before the first step.
    // Their states address buffers by the slots the pass graphs give.
    pipeline_pass_graphs lazily(support::comm(), shape, microbatches, pass_capture::lazily),
        ahead_of_time(support::comm(), shape, microbatches, pass_capture::ahead_of_time);
    stage_state local(n, rank, ranks, lazily, s), ahead(n, rank, ranks, ahead_of_time, s);
    for (int t = 0; t < steps; ++t) local.step(lazily, s), ahead.step(ahead_of_time, s);
    const bool passes_once = lazily.graphs_captured() == lazily.distinct_passes() && ahead_of_time.graphs_captured() == ahead_of_time.distinct_passes();
    bool eager_graph = true, graph_cpu = true, eager_passes = passes_once;
    for (int c = 0; c < chunks; ++c) {
        const std::vector<float> a = eager.weights(c, s), b = graphed.weights(c, s);
        eager_graph = eager_graph && a == b;
        eager_passes = eager_passes && a == local.weights(c, s) && a == ahead.weights(c, s);
        graph_cpu = graph_cpu && b == reference(ranks * chunks, c * ranks + rank, std::vector<int>(std::size_t(steps), microbatches), n);
    }
    const bool same = eager_graph && graph_cpu && eager_passes, everywhere = all_ranks(same);
    std::string slots;
    for (int k : plan.slots) slots += (slots.empty() ? "" : "+") + std::to_string(k);
    const bool looped = shape.kind == pipeline::schedule_kind::interleaved_1f1b;
    const std::string chunk_text = looped ? " x " + std::to_string(chunks) + " chunks" : "";
    const std::string groups = looped ? " in groups of " + std::to_string(shape.group_size()) : "";
    if (rank == 0 || !same)
        std::printf("rank %d, %s, %d ranks%s, %d microbatches%s (%s activation and %d gradient slots on rank %d), %d steps: eager %s graph %s CPU, "
                    "eager %s local %s transformer_engine (%d pass graphs of %zu passes)%s%s\n",
                    rank, std::string(pipeline::name_of(shape.kind)).c_str(), ranks, chunk_text.c_str(), microbatches, groups.c_str(), slots.c_str(),
                    plan.gradient_slots, rank, steps, eager_graph ? "=" : "!=", graph_cpu ? "=" : "!=", eager_passes ? "=" : "!=",
                    eager_passes ? "=" : "!=", lazily.distinct_passes(), p2p.program().compute.size(),
                    p2p.layout() == pipeline::communicator_layout::per_edge ? (", on " + std::to_string(p2p.edges()) + " per-edge communicators").c_str() : "",
                    everywhere ? ", bitwise on every rank" : "");
    return everywhere;
}

//! 1F1B or interleaved 1F1B with the microbatch count changing every step (counts in turn), three
//! ways that must agree bit for bit: eager (the whole program issued for each count), the phases
//! captured once (pipeline_phase_graphs: one eager step, then graphs only, with no capture after
//! the first step), and the CPU. Before each graph launch each rank holds its stream for a random
//! 0 to `delay_us` microseconds, so the ranks reach each group at times that differ.
//! With `stop_rank` >= 0 the graph steps are watched (cuda::nccl_watchdog, short timeouts) and that
//! rank stops taking part before step 5: the other ranks' watchdog must end the job.
bool run_phased_case(const pipeline::schedule_shape& shape, const std::vector<int>& cycle, int steps, int n, int delay_us, int stop_rank) {
    const int ranks = support::comm().size(), rank = support::comm().rank(), chunks = shape.virtual_stages;
    cuda::stream s;
    pipeline_phase_graphs phases(support::comm(), shape);
    const pipeline::phase_layout layout = phases.layout();
    const int most = *std::max_element(cycle.begin(), cycle.end());
    std::vector<int> counts;
    for (int t = 0; t < steps; ++t) counts.push_back(cycle[std::size_t(t) % cycle.size()]);
    std::vector<pipeline_p2p> eager_programs; // one per count: the eager pipeline issues each count's whole program
    for (int m : cycle) eager_programs.emplace_back(support::comm(), shape, m);
    auto eager_program = [&](int m) -> const pipeline_p2p& {
        return eager_programs[std::size_t(std::find(cycle.begin(), cycle.end(), m) - cycle.begin())];
    };
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, most);
    stage_state eager(n, rank, ranks, chunks, plan, most, s, layout), graphed(n, rank, ranks, chunks, plan, most, s, layout);
    for (int m : counts) eager.step(eager_program(m), s);

    graphed.step(eager_program(counts[0]), s); // NCCL opens its connections on the first send: eagerly, before the capture
    phases.capture([&](const pipeline::p2p_op& op) { return graphed.buffer_of(op); },
                   [&](const compute_action& a, cudaStream_t on) { graphed.run(a, on); }, s);
    const int captured = phases.graphs_captured();
    std::mt19937 random(20261128u + unsigned(rank));
    std::uniform_int_distribution<int> delay(0, delay_us);
    long long launches = 0;
    std::optional<cuda::nccl_watchdog> dog;
    if (stop_rank >= 0) {
        watchdog_settings settings; // short, so that a rank that stops is found well within the test's bound
        settings.step_timeout = std::chrono::milliseconds(2000);
        settings.warmup_timeout = std::chrono::milliseconds(5000);
        settings.poll = std::chrono::milliseconds(10);
        dog.emplace(support::comm(), settings);
    }
    for (int t = 1; t < steps; ++t) {
        if (rank == stop_rank && t == 5) {
            std::printf("rank %d stops taking part before step 5\n", rank);
            std::fflush(stdout);
            std::this_thread::sleep_for(std::chrono::minutes(10));
        }
        if (dog) dog->begin_step(true);
        graphed.counter.fill_bytes(0, s);
        phases.launch(counts[std::size_t(t)], s, [&](cudaStream_t on) {
            if (delay_us > 0) pipeline_kernels::spin(1000LL * delay(random), on);
            ++launches;
        });
        graphed.optimizer(s);
        if (dog) {
            dog->end_step(s);
            CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // a rank waiting for one that stopped waits here, watched
        }
    }
    const bool no_recapture = phases.graphs_captured() == captured;
    bool eager_graph = true, graph_cpu = true;
    for (int c = 0; c < chunks; ++c) {
        const std::vector<float> a = eager.weights(c, s), b = graphed.weights(c, s);
        eager_graph = eager_graph && a == b;
        graph_cpu = graph_cpu && b == reference(ranks * chunks, c * ranks + rank, counts, n);
    }
    const bool same = eager_graph && graph_cpu && no_recapture, everywhere = all_ranks(same);
    std::string cycle_text;
    for (int m : cycle) cycle_text += (cycle_text.empty() ? "" : " -> ") + std::to_string(m);
    const bool looped = shape.kind == pipeline::schedule_kind::interleaved_1f1b;
    const std::string what = looped ? "interleaved 1f1b phases, " + std::to_string(ranks) + " ranks x " + std::to_string(chunks) +
                                          " chunks in groups of " + std::to_string(layout.group)
                                    : "1f1b phases, " + std::to_string(ranks) + " ranks";
    std::string slots;
    for (int k : layout.chunk_slots) slots += (slots.empty() ? "" : "+") + std::to_string(k);
    if (rank == 0 || !same)
        std::printf("rank %d, %s, microbatches %s every step, %d steps: %d graphs captured once (warmup, %d steady, %d tails; "
                    "%s activation slots), %lld graph launches after random delays of 0-%d us, %s; eager %s graph %s CPU%s\n",
                    rank, what.c_str(), cycle_text.c_str(), steps, captured, layout.period, captured - 1 - layout.period, slots.c_str(), launches,
                    delay_us, no_recapture ? "no capture after the first step" : "CAPTURED AGAIN", eager_graph ? "=" : "!=", graph_cpu ? "=" : "!=",
                    everywhere ? ", bitwise on every rank" : "");
    return everywhere;
}

//! A rank stops taking part while the others wait on a pipeline edge's communicator (one per
//! edge, split from the world's) inside a replayed whole-step graph. The watchdog watches the
//! world's communicator only, and its fault handler keeps the process alive, as a trainer that
//! saves its state would: aborting the world's communicator must abort the edges split from it,
//! so that the waiting rank's step ends and it leaves, failed, within the bound.
int run_stop_on_edges(const pipeline::schedule_shape& shape, int microbatches, int n, int stop_rank) {
    const int ranks = support::comm().size(), rank = support::comm().rank();
    cuda::stream s;
    const pipeline_p2p p2p(support::comm(), shape, microbatches);
    if (p2p.layout() != pipeline::communicator_layout::per_edge)
        throw std::logic_error("pipeline_p2p_probe: the stop case on edges needs a shape that runs per edge");
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, microbatches);
    stage_state graphed(n, rank, ranks, shape.virtual_stages, plan, microbatches, s);
    graphed.step(p2p, s); // NCCL opens its connections on the first send: eagerly, before the capture
    const cuda::graph g = cuda::capture(s, [&](cudaStream_t on) { graphed.step(p2p, on); });
    const cuda::graph_exec exec(g);
    std::atomic<bool> handled{false};
    watchdog_settings settings; // short, so that a rank that stops is found well within the test's bound
    settings.step_timeout = std::chrono::milliseconds(2000);
    settings.warmup_timeout = std::chrono::milliseconds(5000);
    settings.poll = std::chrono::milliseconds(10);
    settings.abort_timeout = std::chrono::milliseconds(2000);
    cuda::nccl_watchdog dog(support::comm(), settings, [&](const watchdog_fault&) { handled = true; });
    for (int t = 1; t < 10; ++t) {
        if (rank == stop_rank && t == 5) {
            std::printf("rank %d stops taking part before step 5\n", rank);
            std::fflush(stdout);
            std::this_thread::sleep_for(std::chrono::minutes(10));
        }
        dog.begin_step(true);
        exec.launch(s);
        dog.end_step(s);
        const cudaError_t e = cudaStreamSynchronize(s); // a rank waiting for one that stopped waits here, watched
        // The step's kernels end once the communicators are aborted; the handler runs after the
        // aborts have returned.
        if (dog.fired() && !handled) {
            for (int waited = 0; !handled && waited < 2000; ++waited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (!handled) {
                std::printf("rank %d: step %d ended after the watchdog fired, and its fault handler has not run 20 s later: the "
                            "communicators' aborts have not returned\n", rank, t);
                std::fflush(stdout);
                MPI_Abort(MPI_COMM_WORLD, 4);
            }
        }
        if (handled) {
            std::printf("rank %d: step %d ended after its fault handler ran (the stream: %s), with %d per-edge communicators aborted "
                        "by the world's: leaving, failed\n",
                        rank, t, cudaGetErrorString(e), p2p.edges());
            std::fflush(stdout);
            MPI_Abort(MPI_COMM_WORLD, 3); // the stopped rank never finalizes
        }
        CAPSCOPE_CHECK(e);
    }
    std::printf("rank %d: 9 steps, none stopped\n", rank);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "gpus") == 0) return std::printf("%d\n", cuda::usable_device_count()), 0;
    breakage::install_from_environment();
    int n = 1 << 16, steps = 3, only_m = 0, phase_steps = 100, delay_us = 500, stop_rank = -1;
    std::string only_kind;
    pipeline::p2p_grouping grouping = pipeline::p2p_grouping::megatron;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i], value = argv[i + 1];
        if (flag == "--floats") n = std::stoi(value);
        else if (flag == "--steps") steps = std::stoi(value);
        else if (flag == "--microbatches") only_m = std::stoi(value);
        else if (flag == "--kind") only_kind = value;
        else if (flag == "--phase-steps") phase_steps = std::stoi(value);
        else if (flag == "--delay-us") delay_us = std::stoi(value);
        else if (flag == "--stop-rank") stop_rank = std::stoi(value);
        else if (flag == "--grouping" && (value == "megatron" || value == "paired" || value == "one_by_one"))
            grouping = value == "megatron" ? pipeline::p2p_grouping::megatron : value == "paired" ? pipeline::p2p_grouping::paired : pipeline::p2p_grouping::one_by_one;
        else return std::fprintf(stderr, "pipeline_p2p_probe: unknown option %s %s\n", flag.c_str(), value.c_str()), 2;
    }
    if (cuda::usable_device_count() == 0) return std::puts("no usable CUDA device: skipped"), 77;
    support::comm(); // takes this rank's GPU before any stream or buffer is made
    const int ranks = support::comm().size();
    if (ranks < 2) return std::puts("one rank: a pipeline needs two (mpirun -np 2): skipped"), 77;
    if (stop_rank >= 0 && grouping != pipeline::p2p_grouping::megatron) { // on edges, with the trainer's fault handler
        // The shapes that run per edge: 1F1B one by one; interleaved paired (two chunks a rank).
        const bool looped = grouping == pipeline::p2p_grouping::paired;
        pipeline::schedule_shape shape{looped ? pipeline::schedule_kind::interleaved_1f1b : pipeline::schedule_kind::one_f_one_b, ranks,
                                       looped ? 2 : 1, ranks * (looped ? 2 : 1)};
        shape.grouping = grouping;
        try {
            return run_stop_on_edges(shape, 2 * ranks, n, stop_rank);
        } catch (const std::exception& e) {
            std::printf("rank %d: %s\n", support::mpi().rank(), e.what());
            return 1;
        }
    }
    bool ok = true;
    try {
    for (pipeline::schedule_kind kind : {pipeline::schedule_kind::one_f_one_b, pipeline::schedule_kind::gpipe, pipeline::schedule_kind::interleaved_1f1b}) {
        if (!only_kind.empty() && only_kind != pipeline::name_of(kind)) continue;
        const bool looped = kind == pipeline::schedule_kind::interleaved_1f1b;
        for (int group : looped ? std::vector<int>{0, ranks + 1} : std::vector<int>{0}) {
            pipeline::schedule_shape shape{kind, ranks, looped ? 2 : 1, ranks * (looped ? 2 : 1), group};
            shape.grouping = grouping;
            const int g = shape.group_size();
            const std::vector<int> counts = only_m ? std::vector<int>{only_m} : looped ? std::vector<int>{g, 2 * g} : std::vector<int>{ranks, 2 * ranks + 1};
            for (int m : counts) ok = run_case(shape, m, steps, n) && ok;
        }
    }
    if ((only_kind.empty() || only_kind == "1f1b phases") && grouping == pipeline::p2p_grouping::megatron && phase_steps > 0) {
        const pipeline::schedule_shape plain{pipeline::schedule_kind::one_f_one_b, ranks, 1, ranks};
        ok = run_phased_case(plain, {8, 12, 16}, phase_steps, n, delay_us, stop_rank) && ok;
    }
    if ((only_kind.empty() || only_kind == "interleaved phases") && grouping == pipeline::p2p_grouping::megatron && phase_steps > 0 && stop_rank < 0) {
        // Two chunks a rank in groups of the ranks; counts in whole groups from the least every rank's phases serve.
        const pipeline::schedule_shape looped{pipeline::schedule_kind::interleaved_1f1b, ranks, 2, 2 * ranks};
        const int least = pipeline::phase_layout_of(looped, support::comm().rank()).least_microbatches; // the same on every rank
        const int g = looped.group_size(), first = std::max(8, (least + g - 1) / g * g), step = std::lcm(g, 4);
        ok = run_phased_case(looped, {first, first + step, first + 2 * step}, phase_steps, n, delay_us, -1) && ok;
    }
    } catch (const std::exception& e) { // a refused schedule: on every rank alike, before anything is sent
        std::printf("rank %d: %s\n", support::mpi().rank(), e.what());
        return 1;
    }
    if (support::mpi().rank() == 0) std::printf("%s\n", ok ? "every case bitwise equal: eager, graph, local, transformer_engine and CPU" : "FAIL");
    return ok ? 0 : 1;
}
