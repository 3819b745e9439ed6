// Data parallel and sharded training of the example model on 1 and 2 GPUs (weak scaling: the same
// batch per GPU), one process per GPU:
//
//   mpirun -np 1 data_parallel --csv FILE     then     mpirun -np 2 data_parallel --csv FILE
//   python3 bench/data_parallel_table.py FILE > table.md
//
// bf16, hidden 1024, 16 heads, ffn 4096, seq 512, batch 4 per GPU, 2 microbatches, 8 dense
// layers, vocab 256. Variants: data parallel, sharded (re-gather for backward, each layer's
// gathers prefetched while the layer before it computes) and sharded with gathers on demand, each under
// `none` (eager, collectives too), `transformer_engine` (per-layer graphs, collectives captured
// in them) and `full_iteration` (the whole step one graph); and three cuts of what NCCL's kernels
// take from compute, under the two graphed impls: NCCL's fewest CTAs (data parallel), the
// all-gathers on copy engines (NCCL 2.28's zero-CTA policy, buffers in symmetric windows;
// data parallel splits each all-reduce into a reduce-scatter and an all-gather for it, or into an
// all-to-all, a sum and an all-gather, all of whose bytes move on copy engines) and one gather
// a step (sharded, each layer's gathered copy kept for the step: a quarter of re-gathering's);
// two copy-engine variants also with their memory operations left as graph nodes, for the launch
// cost that cuda/mem_op_kernel.hpp is to remove (measured on one GPU so far).
// Per variant: device time per step
// (CUDA events, median over rounds; the slowest rank's), host time per step (the enqueueing
// call, median), device memory the trainer holds per rank (cudaMemGetInfo before it is built and
// after its warmup and captures: parameters, optimizer state, activations, graphs), and the
// parameter and optimizer-state bytes per rank. All variants are built first and run
// round-robin, so drift hits them alike. Built with CUPTI and given --csv, each variant then runs
// 10 steps traced on its own, and the CSV gets where their time went (the rank with the longest
// traced step: compute kernels busy, communication busy and with no compute beside it, no kernel
// running, copies busy and alone), which bench/data_parallel_table.py sets against one GPU
// without collectives. `--only MODE/IMPL[,MODE/IMPL...]` builds and times those
// (still round-robin); with `--trace` and one variant, it also prints where the step's time goes
// (bench/kernel_timeline.hpp, CUPTI). Exits 77 without a GPU.

#include "arguments.hpp"
#include "round_robin.hpp"

#include <gpt/data_parallel.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#if defined(BENCH_WITH_CUPTI)
#include "kernel_timeline.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;

struct variant {
    std::string mode, impl;
    std::function<void(cudaStream_t)> step;
    double device_bytes = 0, state_bytes = 0;
    std::vector<float> device_ms, host_us;
    //! Where a traced step's time went (bench/kernel_timeline.hpp), ms: span, compute kernels busy,
    //! communication busy, communication with no compute beside it, no kernel running, copies
    //! busy, copies with no kernel beside them. NaN untraced.
    double traced[7] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    long mem_op_kernels = 0, mem_op_nodes_kept = 0, event_records_dropped = 0; //!< the runner's, after the warmup and captures
};

using bench::device_used;
using bench::median;

gpt::model_config bench_model() {
    gpt::model_config c;
    c.vocab = 256;
    c.hidden = 1024;
    c.heads = 16;
    c.ffn_hidden = 4096;
    c.seq_len = 512;
    c.batch = 4;
    c.microbatches = 2;
    c.layer_pattern = "DDDDDDDD";
    return c;
}

using none_cfg = config<impl::eager>;
using te_cfg = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<1>>;
using full_cfg = config<impl::whole_iteration, no_nan_check, warmup_steps<1>>;
using sharded_mode = sharded<static_double_buffer, persistent_buffer, regather_for_backward>; // gathers prefetched one layer ahead
using on_demand_mode = sharded<static_double_buffer, persistent_buffer, regather_for_backward, gather_on_demand>;
using kept_mode = sharded<static_double_buffer, persistent_buffer, keep_for_backward>; // one gather a step, a buffer per layer

//! The variants, as `--only` names them (main() adds them in this order).
const std::vector<std::string> variant_names{"data parallel/none",      "data parallel/transformer_engine",
                                             "data parallel/full_iteration", "sharded/none",
                                             "sharded/transformer_engine", "sharded/full_iteration",
                                             "sharded (gathers on demand)/none", "sharded (gathers on demand)/transformer_engine",
                                             "sharded (gathers on demand)/full_iteration",
                                             "data parallel (graphs as captured)/transformer_engine",
                                             "sharded (graphs as captured)/transformer_engine",
                                             "data parallel (fewest CTAs)/transformer_engine", "data parallel (fewest CTAs)/full_iteration",
                                             "data parallel (copy-engine gathers)/transformer_engine", "data parallel (copy-engine gathers)/full_iteration",
                                             "data parallel (copy-engine all-to-all)/transformer_engine", "data parallel (copy-engine all-to-all)/full_iteration",
                                             "data parallel (copy-engine gathers; 8 CTAs)/transformer_engine", "data parallel (copy-engine gathers; 8 CTAs)/full_iteration",
                                             "data parallel (copy-engine gathers; 4 CTAs)/transformer_engine", "data parallel (copy-engine gathers; 4 CTAs)/full_iteration",
                                             "sharded (copy-engine gathers)/transformer_engine", "sharded (copy-engine gathers)/full_iteration",
                                             "sharded (kept for backward)/transformer_engine", "sharded (kept for backward)/full_iteration",
                                             "sharded (kept; copy-engine gathers)/transformer_engine", "sharded (kept; copy-engine gathers)/full_iteration",
                                             "sharded (kept; all on copy engines)/transformer_engine", "sharded (kept; all on copy engines)/full_iteration",
                                             "data parallel (copy-engine all-to-all; memory operations as nodes)/transformer_engine",
                                             "data parallel (copy-engine all-to-all; memory operations as nodes)/full_iteration",
                                             "sharded (kept; copy-engine gathers; memory operations as nodes)/transformer_engine",
                                             "sharded (kept; copy-engine gathers; memory operations as nodes)/full_iteration",
                                             "data parallel (event records kept)/full_iteration", "sharded (event records kept)/full_iteration",
                                             "sharded (kept; copy-engine gathers; event records kept)/full_iteration"};

//! Builds a trainer, feeds it a fixed batch (random tokens, this rank's), warms it up (warmup
//! steps, captures), and measures what it holds.
template <class Config, class Mode>
void add(std::vector<variant>& out, std::vector<std::shared_ptr<void>>& keep, const cuda::nccl_communicator& comm, const char* mode,
         const char* impl, int rank, cudaStream_t s, const std::vector<std::string>& only, gpt::collective_buffers buffers = gpt::collective_buffers::device) {
    const std::string name = std::string(mode) + "/" + impl;
    if (std::find(variant_names.begin(), variant_names.end(), name) == variant_names.end())
        throw std::logic_error("bench/data_parallel: variant '" + name + "' is missing from variant_names, so --only cannot pick it");
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) return;
    const gpt::model_config c = bench_model();
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const std::size_t before = device_used();
    auto t = std::make_shared<gpt::data_parallel_trainer<T, Config, Mode>>(c, comm, s, watchdog_settings{}, step_watchdog::fault_handler{}, buffers);
    std::mt19937 rng(7 + unsigned(rank));
    std::uniform_int_distribution<int> tok(0, c.vocab - 1);
    std::vector<int> tokens(std::size_t(c.tokens())), labels(tokens.size());
    for (int mb = 0; mb < c.microbatches; ++mb) {
        for (auto& x : tokens) x = tok(rng);
        for (std::size_t i = 0; i < tokens.size(); ++i) labels[i] = (i + 1) % std::size_t(c.seq_len) ? tokens[i + 1] : -1;
        t->model().set_batch(mb, tokens, labels, s);
    }
    for (int i = 0; i < 3; ++i) t->step(s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    variant v{mode, impl, [p = t.get()](cudaStream_t st) { p->step(st); }, double(device_used() - before),
              double(t->model().parameters().device_bytes()), {}, {}};
    v.mem_op_kernels = t->runner().counters().mem_op_kernels;
    v.mem_op_nodes_kept = t->runner().counters().mem_op_nodes_kept;
    v.event_records_dropped = t->runner().counters().event_records_dropped;
    out.push_back(std::move(v));
    keep.push_back(std::move(t));
}

} // namespace

int main(int argc, char** argv) {
    int rounds = 10, steps_per_round = 5;
    std::string csv, only_text;
    bool trace = false;
    bench::arguments args("data_parallel");
    args.text("--csv", csv).integer("--rounds", rounds, 1).text("--only", only_text, "MODE/IMPL").flag("--trace", trace).parse_or_exit(argc, argv);
    // --only: one variant, or several separated by commas (no variant name has one).
    std::vector<std::string> only;
    for (std::size_t at = 0; !only_text.empty() && at <= only_text.size();) {
        const std::size_t comma = std::min(only_text.find(',', at), only_text.size());
        only.push_back(only_text.substr(at, comma - at));
        at = comma + 1;
    }
    if (trace && only.size() != 1) args.refuse("--trace breaks one variant down: give --only MODE/IMPL with it, one variant");
    if (trace && !csv.empty()) args.refuse("--trace slows the steps it traces: time them without it for --csv");
#if !defined(BENCH_WITH_CUPTI)
    if (trace) args.refuse("--trace needs CUPTI, which this build did not find");
#endif
    for (const std::string& name : only)
        if (std::find(variant_names.begin(), variant_names.end(), name) == variant_names.end()) {
            std::string names;
            for (const auto& n : variant_names) names += (names.empty() ? "" : ", ") + ("'" + n + "'");
            args.refuse("--only takes variants separated by commas, not '" + name + "': " + names);
        }
    if (cuda::usable_device_count() == 0) {
        std::printf("no CUDA device: skipped\n");
        return cuda::skip_exit_code;
    }
    cuda::mpi_session mpi;
    const cuda::nccl_communicator comm = cuda::communicator_from_mpi(mpi);
    // Graph copies run NCCL's copy-engine memory operations as a kernel (opt-in for now,
    // cuda/mem_op_kernel.hpp); the "memory operations as nodes" rows keep them.
    cuda::prepare_mem_op_kernel();
    cuda::stream s;
    std::vector<std::shared_ptr<cuda::nccl_communicator>> communicators; // outlive the trainers below
    std::vector<variant> v;
    std::vector<std::shared_ptr<void>> keep;
    const int r = mpi.rank();
    add<none_cfg, gpt::replicated>(v, keep, comm, "data parallel", "none", r, s, only);
    add<te_cfg, gpt::replicated>(v, keep, comm, "data parallel", "transformer_engine", r, s, only);
    add<full_cfg, gpt::replicated>(v, keep, comm, "data parallel", "full_iteration", r, s, only);
    add<none_cfg, sharded_mode>(v, keep, comm, "sharded", "none", r, s, only);
    add<te_cfg, sharded_mode>(v, keep, comm, "sharded", "transformer_engine", r, s, only);
    add<full_cfg, sharded_mode>(v, keep, comm, "sharded", "full_iteration", r, s, only);
    // (No comma in a mode: the CSV's fields are not quoted.)
    add<none_cfg, on_demand_mode>(v, keep, comm, "sharded (gathers on demand)", "none", r, s, only);
    add<te_cfg, on_demand_mode>(v, keep, comm, "sharded (gathers on demand)", "transformer_engine", r, s, only);
    add<full_cfg, on_demand_mode>(v, keep, comm, "sharded (gathers on demand)", "full_iteration", r, s, only);
    // The per-layer graphs instantiated as captured, NCCL's user objects and all (before
    // cuda/graph_copy.hpp): their launches wait once 28 are in flight, so the host cannot run
    // ahead. The same trainers otherwise; the seam is read at capture, in add()'s warmup.
    detail::installed_breakage().keep_user_objects = true;
    add<te_cfg, gpt::replicated>(v, keep, comm, "data parallel (graphs as captured)", "transformer_engine", r, s, only);
    add<te_cfg, sharded_mode>(v, keep, comm, "sharded (graphs as captured)", "transformer_engine", r, s, only);
    detail::installed_breakage().keep_user_objects = false;
    // Issue 50's cuts of what NCCL's kernels take from compute, each on its own communicator:
    // NCCL's fewest CTAs; all-gathers on copy engines (no CTA, buffers in symmetric windows);
    // and fewer gathers (each layer's gathered copy kept for the step: one gather a step).
    communicators.push_back(std::make_shared<cuda::nccl_communicator>(cuda::communicator_from_mpi(mpi, {cuda::nccl_cta_policy::efficiency})));
    communicators.push_back(std::make_shared<cuda::nccl_communicator>(cuda::communicator_from_mpi(mpi, {cuda::nccl_cta_policy::zero})));
    add<te_cfg, gpt::replicated>(v, keep, *communicators[0], "data parallel (fewest CTAs)", "transformer_engine", r, s, only);
    add<full_cfg, gpt::replicated>(v, keep, *communicators[0], "data parallel (fewest CTAs)", "full_iteration", r, s, only);
    add<te_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine gathers)", "transformer_engine", r, s, only,
                                 gpt::collective_buffers::nccl_symmetric);
    add<full_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine gathers)", "full_iteration", r, s, only,
                                   gpt::collective_buffers::nccl_symmetric);
    // ... and the reduce-scatters too, as an all-to-all on copy engines and a sum on each rank.
    add<te_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine all-to-all)", "transformer_engine", r, s, only,
                                 gpt::collective_buffers::nccl_symmetric_all_to_all);
    add<full_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine all-to-all)", "full_iteration", r, s, only,
                                   gpt::collective_buffers::nccl_symmetric_all_to_all);
    // ... and the reduce-scatters, which stay on SMs, held to fewer CTAs (ncclConfig_t::maxCTAs).
    if (!only.empty() && std::any_of(only.begin(), only.end(), [](const std::string& n) { return n.find(" CTAs)") != std::string::npos; })) {
        communicators.push_back(std::make_shared<cuda::nccl_communicator>(cuda::communicator_from_mpi(mpi, {cuda::nccl_cta_policy::zero, 8})));
        communicators.push_back(std::make_shared<cuda::nccl_communicator>(cuda::communicator_from_mpi(mpi, {cuda::nccl_cta_policy::zero, 4})));
        add<te_cfg, gpt::replicated>(v, keep, *communicators[2], "data parallel (copy-engine gathers; 8 CTAs)", "transformer_engine", r, s, only,
                                     gpt::collective_buffers::nccl_symmetric);
        add<full_cfg, gpt::replicated>(v, keep, *communicators[2], "data parallel (copy-engine gathers; 8 CTAs)", "full_iteration", r, s, only,
                                       gpt::collective_buffers::nccl_symmetric);
        add<te_cfg, gpt::replicated>(v, keep, *communicators[3], "data parallel (copy-engine gathers; 4 CTAs)", "transformer_engine", r, s, only,
                                     gpt::collective_buffers::nccl_symmetric);
        add<full_cfg, gpt::replicated>(v, keep, *communicators[3], "data parallel (copy-engine gathers; 4 CTAs)", "full_iteration", r, s, only,
                                       gpt::collective_buffers::nccl_symmetric);
    }
    add<te_cfg, sharded_mode>(v, keep, *communicators[1], "sharded (copy-engine gathers)", "transformer_engine", r, s, only,
                              gpt::collective_buffers::nccl_symmetric);
    add<full_cfg, sharded_mode>(v, keep, *communicators[1], "sharded (copy-engine gathers)", "full_iteration", r, s, only,
                                gpt::collective_buffers::nccl_symmetric);
    add<te_cfg, kept_mode>(v, keep, comm, "sharded (kept for backward)", "transformer_engine", r, s, only);
    add<full_cfg, kept_mode>(v, keep, comm, "sharded (kept for backward)", "full_iteration", r, s, only);
    // Kept, with its one gather a step on copy engines.
    add<te_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; copy-engine gathers)", "transformer_engine", r, s, only,
                           gpt::collective_buffers::nccl_symmetric);
    add<full_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; copy-engine gathers)", "full_iteration", r, s, only,
                             gpt::collective_buffers::nccl_symmetric);
    // ... and its reduce-scatters too, as all-to-alls and sums.
    add<te_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; all on copy engines)", "transformer_engine", r, s, only,
                           gpt::collective_buffers::nccl_symmetric_all_to_all);
    add<full_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; all on copy engines)", "full_iteration", r, s, only,
                             gpt::collective_buffers::nccl_symmetric_all_to_all);
    // Copy-engine collectives with their memory operations (which order the ranks' copies) left
    // as memory-operation nodes in the copied graphs, as before cuda/mem_op_kernel.hpp: CUDA does
    // their work on the host at every launch. The seam is read at capture, in add()'s warmup.
    detail::installed_breakage().keep_mem_op_nodes = true;
    add<te_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine all-to-all; memory operations as nodes)", "transformer_engine",
                                 r, s, only, gpt::collective_buffers::nccl_symmetric_all_to_all);
    add<full_cfg, gpt::replicated>(v, keep, *communicators[1], "data parallel (copy-engine all-to-all; memory operations as nodes)", "full_iteration",
                                   r, s, only, gpt::collective_buffers::nccl_symmetric_all_to_all);
    add<te_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; copy-engine gathers; memory operations as nodes)", "transformer_engine", r, s,
                           only, gpt::collective_buffers::nccl_symmetric);
    add<full_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; copy-engine gathers; memory operations as nodes)", "full_iteration", r, s,
                             only, gpt::collective_buffers::nccl_symmetric);
    detail::installed_breakage().keep_mem_op_nodes = false;
    // NCCL's graph-mixing event records (one after each collective) all kept in the copied
    // graphs, as before cuda/graph_event_records.hpp: part of each one's work is the host's at
    // every launch. The seam is read at capture, in add()'s warmup.
    detail::installed_breakage().keep_event_records = true;
    add<full_cfg, gpt::replicated>(v, keep, comm, "data parallel (event records kept)", "full_iteration", r, s, only);
    add<full_cfg, sharded_mode>(v, keep, comm, "sharded (event records kept)", "full_iteration", r, s, only);
    add<full_cfg, kept_mode>(v, keep, *communicators[1], "sharded (kept; copy-engine gathers; event records kept)", "full_iteration", r, s, only,
                             gpt::collective_buffers::nccl_symmetric);
    detail::installed_breakage().keep_event_records = false;

#if defined(BENCH_WITH_CUPTI)
    // --trace: the timed rounds traced (their times then include the tracing's cost).
    bench::kernel_timeline timeline;
    if (trace) timeline.start();
#endif
    bench::time_round_robin(v, rounds, steps_per_round, s);
#if defined(BENCH_WITH_CUPTI)
    // The breakdown for the table (--csv), after the timed rounds: each variant's steps traced on
    // their own (tracing slows them, so the times above are untraced). Tracing starts before the
    // barrier, so that no rank's set-up of it shows as another's wait in a collective.
    if (!trace && !csv.empty())
        for (variant& x : v) {
            constexpr int traced_steps = 10;
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            bench::kernel_timeline steps_traced;
            steps_traced.start(false); // kernels and copies only: tracing the host's calls slows it more
            CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
            for (int i = 0; i < traced_steps; ++i) x.step(s);
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            steps_traced.stop();
            const auto b = steps_traced.breakdown(traced_steps);
            const double mine[7] = {b.span, b.compute, b.communication, b.exposed, b.idle, b.copies, b.copies_alone};
            std::copy(std::begin(mine), std::end(mine), std::begin(x.traced));
        }
    if (trace) {
        timeline.stop();
        const std::string prefix = std::to_string(mpi.size()) + " GPU(s), rank " + std::to_string(r) + ", " + only.front() + ": ";
        for (int rank = 0; rank < mpi.size(); ++rank) { // one rank at a time, so lines do not interleave
            if (rank == r) timeline.print(rounds * steps_per_round, prefix.c_str());
            std::fflush(stdout);
            CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        }
    }
#endif

    cudaDeviceProp prop{};
    CAPSCOPE_CHECK(cudaGetDeviceProperties(&prop, 0));
    // Rank 0 writes the CSV; every rank learns whether it could (so none waits alone in a collective).
    static constexpr char header[] = "gpus,mode,impl,step_ms,host_us,device_mib_per_rank,state_mib_per_rank,tokens_per_s,device,"
                                     "traced_span_ms,compute_ms,communication_ms,exposed_ms,idle_ms,copies_ms,copies_alone_ms";
    std::FILE* out = nullptr;
    int csv_refused = 0;
    if (r == 0 && !csv.empty()) {
        std::string first;
        if (std::FILE* existing = std::fopen(csv.c_str(), "r")) {
            char line[512] = {};
            if (std::fgets(line, sizeof line, existing)) first = line;
            std::fclose(existing);
            while (!first.empty() && (first.back() == '\n' || first.back() == '\r')) first.pop_back();
        }
        if (!first.empty() && first != header) {
            std::fprintf(stderr, "data_parallel: %s has other columns (an older bench's) -- fix: another file, or remove it\n", csv.c_str());
            csv_refused = 1;
        } else if (!(out = std::fopen(csv.c_str(), "a"))) {
            std::fprintf(stderr, "data_parallel: cannot write %s\n", csv.c_str());
            csv_refused = 1;
        } else if (first.empty())
            std::fprintf(out, "%s\n", header);
    }
    CAPSCOPE_MPI_CHECK(MPI_Bcast(&csv_refused, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (csv_refused) return 1;
    const gpt::model_config c = bench_model();
    for (auto& x : v) {
        // The slowest rank's median step, the largest memory of any rank.
        double per[4] = {median(x.device_ms), median(x.host_us), x.device_bytes / 1048576.0, x.state_bytes / 1048576.0};
        CAPSCOPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, per, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        const double tokens_per_s = double(c.tokens()) * c.microbatches * mpi.size() / (per[0] / 1000.0);
        // The breakdown of the rank whose traced step was longest (its seven figures together).
        struct {
            double span;
            int rank;
        } longest{std::isnan(x.traced[0]) ? -1.0 : x.traced[0], r};
        CAPSCOPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &longest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));
        double traced[7];
        std::copy(std::begin(x.traced), std::end(x.traced), std::begin(traced));
        CAPSCOPE_MPI_CHECK(MPI_Bcast(traced, 7, MPI_DOUBLE, longest.rank, MPI_COMM_WORLD));
        if (r != 0) continue;
        std::printf("%d GPU(s) %-14s %-19s step %8.3f ms  host %8.1f us  device %8.1f MiB/rank  state %7.1f MiB/rank  %9.0f tokens/s\n",
                    mpi.size(), x.mode.c_str(), x.impl.c_str(), per[0], per[1], per[2], per[3], tokens_per_s);
        if (x.mem_op_kernels || x.mem_op_nodes_kept)
            std::printf("%d GPU(s) %-14s %-19s memory-operation nodes (rank 0): %ld run as kernels, %ld kept\n", mpi.size(), x.mode.c_str(),
                        x.impl.c_str(), x.mem_op_kernels, x.mem_op_nodes_kept);
        if (x.event_records_dropped)
            std::printf("%d GPU(s) %-14s %-19s event records (rank 0): %ld run as empty nodes, a later record of their event standing for each\n",
                        mpi.size(), x.mode.c_str(), x.impl.c_str(), x.event_records_dropped);
        if (!std::isnan(traced[0]))
            std::printf("%d GPU(s) %-14s %-19s traced (rank %d): span %.3f ms, compute %.3f, communication %.3f (%.3f with no compute beside it), "
                        "no kernel %.3f, copies %.3f (%.3f with no kernel beside them)\n", mpi.size(), x.mode.c_str(), x.impl.c_str(), longest.rank,
                        traced[0], traced[1], traced[2], traced[3], traced[4], traced[5], traced[6]);
        if (out) {
            std::fprintf(out, "%d,%s,%s,%.4f,%.2f,%.1f,%.1f,%.0f,%s", mpi.size(), x.mode.c_str(), x.impl.c_str(), per[0], per[1], per[2], per[3],
                         tokens_per_s, prop.name);
            for (double t : traced) std::isnan(t) ? std::fprintf(out, ",") : std::fprintf(out, ",%.4f", t);
            std::fprintf(out, "\n");
        }
    }
    if (out) std::fclose(out);
    return 0;
}
