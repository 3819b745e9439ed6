// The example model pipelined (gpt::pipeline_model), 1F1B over the ranks (one process per GPU),
// three ways side by side in one run per microbatch count M (8 and 32):
//   eager   capscope's eager pipeline: each pass's kernels and each group of sends and receives
//           issued from the host (pipeline_p2p)
//   passes  each pass replayed from its graph (per chunk, direction and slot), the sends and
//           receives eager between them (pipeline_pass_graphs, transformer_engine)
//   whole   the whole step, sends and receives inside, one graph (full_iteration)
// Step time: device time between events, median of the rounds, the slowest rank's. Idle per rank:
// 1 - busy / whole, where busy is the rank's passes alone (its compute order captured without
// sends and receives). Memory per M (8, 16, 32, 64): the rank's model (parameters, optimizer
// state, one activation set per chunk, the slots), the slots alone, and the whole-step graph.
// Every backward recomputes its forward (gpt/pipeline.hpp), so a step computes a forward, a
// recomputed forward and a backward per microbatch and layer: about 4 forwards' worth.
// With --trace (CUPTI), after the timing, each rank's eager step and whole-step graph at each
// timed count are traced: compute kernels busy, NCCL's kernels (the sends and receives), and time
// with no kernel running, per step (bench/kernel_timeline.hpp). What the graph can take away is
// the eager step's time with no kernel running.
//
//   mpirun -np 2 pipeline_model [--hidden H] [--seq S] [--batch B] [--layers-per-rank L] [--rounds R] [--trace]
//   exit 77 without 2 GPUs

#include "arguments.hpp"
#include "mpi_timing.hpp"
#include "round_robin.hpp"

#include "../tests/gpu/mpi_support.hpp"

#if defined(BENCH_WITH_CUPTI)
#include "kernel_timeline.hpp"
#endif

#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_pass_graphs.hpp>
#include <capscope/pipeline/schedule_text.hpp>
#include <gpt/pipeline.hpp>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace capscope;
using bench::gather;
using bench::max_over_ranks;
using bench::time_steps;

namespace {

constexpr double mib = 1024.0 * 1024.0;

gpt::model_config config_of(int hidden, int seq, int batch, int layers, int microbatches) {
    gpt::model_config c;
    c.vocab = 4096;
    c.hidden = hidden;
    c.heads = hidden / 64;
    c.ffn_hidden = 4 * hidden;
    c.seq_len = seq;
    c.batch = batch;
    c.microbatches = microbatches;
    c.layer_pattern = std::string(std::size_t(layers), 'D');
    return c;
}

void load_batches(gpt::pipeline_model<float>& model, cudaStream_t s) {
    const gpt::model_config& c = model.config();
    std::mt19937 random(2026);
    std::uniform_int_distribution<int> token(0, c.vocab - 1);
    std::vector<int> tokens(std::size_t(c.tokens())), labels(tokens.size());
    for (int mb = 0; mb < c.microbatches; ++mb) {
        for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = token(random), labels[i] = token(random);
        model.set_batch(mb, tokens, labels, s);
    }
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
}

} // namespace

int main(int argc, char** argv) {
    int hidden = 512, seq = 256, batch = 4, layers_per_rank = 2, rounds = 5;
    bool trace = false;
    bench::arguments args("pipeline_model");
    args.integer("--hidden", hidden, 64, 8192)
        .integer("--seq", seq, 16, 8192)
        .integer("--batch", batch, 1, 1024)
        .integer("--layers-per-rank", layers_per_rank, 1, 64)
        .integer("--rounds", rounds, 1)
        .flag("--trace", trace)
        .parse_or_exit(argc, argv);
    if (hidden % 64 != 0) args.refuse("--hidden must be a multiple of 64 (heads of 64)");
#if !defined(BENCH_WITH_CUPTI)
    if (trace) args.refuse("--trace needs CUPTI, which this build did not find");
#endif
    const std::string device = bench::device_or_skip();
    if (cuda::usable_device_count() < 2) return std::printf("one GPU: a pipeline needs two (mpirun -np 2): skipped\n"), 77;
    support::comm(); // takes this rank's GPU before any stream or buffer
    const int ranks = support::comm().size(), rank = support::comm().rank();
    if (ranks < 2) return std::printf("one rank: a pipeline needs two (mpirun -np 2): skipped\n"), 77;
    const pipeline::schedule_shape shape{.kind = pipeline::schedule_kind::one_f_one_b, .ranks = ranks, .layers = layers_per_rank * ranks};
    const std::vector<int> timed_counts{8, 32}, memory_counts{8, 16, 32, 64};
    const int steps = 5;
    cuda::stream s;

    struct memory_row {
        double model, slots, whole;
    };
    std::map<int, memory_row> memory;
    struct time_row {
        int m;
        double eager, passes, whole;
        std::vector<double> idle;
    };
    std::vector<time_row> rows;
#if defined(BENCH_WITH_CUPTI)
    struct traced {
        traced(const char* w, int count) : way(w), m(count) {}
        const char* way;
        int m;
        bench::kernel_timeline timeline; // CUPTI holds its address while tracing: kept in place (a deque)
    };
    std::deque<traced> traces;
#endif
    for (int m : memory_counts) {
        const gpt::model_config cfg = config_of(hidden, seq, batch, shape.layers, m);
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        const std::size_t before_model = bench::device_used();
        gpt::pipeline_model<float> model(cfg, shape, rank, s);
        const double model_mib = double(bench::device_used() - before_model) / mib;
        load_batches(model, s);
        const pipeline_p2p p2p(support::comm(), shape, m);
        model.step(p2p, s); // NCCL opens its connections on the first send: eagerly, before any capture
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        const std::size_t before_graph = bench::device_used();
        const cuda::graph_exec whole(cuda::capture(s, [&](cudaStream_t on) { model.step(p2p, on); }));
        whole.launch(s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        memory[m] = {max_over_ranks(model_mib), max_over_ranks(double(model.slot_bytes()) / mib),
                     max_over_ranks(double(bench::device_used() - before_graph) / mib)};
        if (std::find(timed_counts.begin(), timed_counts.end(), m) == timed_counts.end()) continue;

        pipeline_pass_graphs passes(support::comm(), shape, m, pass_capture::ahead_of_time);
        model.step(passes, s); // captured ahead of the first step, outside the timing
        // The rank's passes alone, in its compute order, without sends and receives.
        const cuda::graph_exec busy(cuda::capture(s, [&](cudaStream_t on) {
            model.begin_step(on);
            for (const pipeline::compute_action& a : p2p.program().compute) model.pass(a, on);
            model.finish_step(on);
        }));
        std::vector<double> eager, per_pass, graph, alone;
        for (int r = 0; r < rounds; ++r) {
            eager.push_back(time_steps([&](cudaStream_t on) { model.step(p2p, on); }, 1, steps, s));
            per_pass.push_back(time_steps([&](cudaStream_t on) { model.step(passes, on); }, 1, steps, s));
            graph.push_back(time_steps([&](cudaStream_t on) { whole.launch(on); }, 1, steps, s));
            alone.push_back(time_steps([&](cudaStream_t on) { busy.launch(on); }, 1, steps, s));
        }
        time_row x{m, max_over_ranks(bench::median(eager)), max_over_ranks(bench::median(per_pass)), max_over_ranks(bench::median(graph)), {}};
        x.idle = gather(1.0 - bench::median(alone) / bench::median(graph), ranks);
        rows.push_back(x);
#if defined(BENCH_WITH_CUPTI)
        // After the timing: tracing slows the host. Printed one rank at a time, after the tables.
        for (const char* way : trace ? std::vector<const char*>{"eager", "whole-step graph"} : std::vector<const char*>{}) {
            const bool eager_way = std::string(way) == "eager";
            bench::kernel_timeline& timeline = traces.emplace_back(way, m).timeline;
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
            timeline.start();
            (void)time_steps([&](cudaStream_t on) { eager_way ? model.step(p2p, on) : whole.launch(on); }, 1, steps, s);
            timeline.stop();
        }
#endif
    }

    if (rank == 0) {
        std::printf("example model pipelined, 1f1b, %d ranks, %s; %d dense layers a rank, hidden %d, seq %d, batch %d a microbatch, fp32\n", ranks,
                    device.c_str(), layers_per_rank, hidden, seq, batch);
        std::printf("\n| M | eager pipeline | per-pass graphs | whole-step graph | eager / whole | idle per rank (whole) | bubble in theory |\n");
        std::printf("|---:|---:|---:|---:|---:|---|---:|\n");
        for (const time_row& x : rows) {
            std::string idle;
            for (double v : x.idle) idle += (idle.empty() ? "" : ", ") + std::to_string(int(v * 1000 + 0.5) / 10) + "." + std::to_string(int(v * 1000 + 0.5) % 10) + "%";
            std::printf("| %d | %.3f ms | %.3f ms | %.3f ms | %.2fx | %s | %.1f%% |\n", x.m, x.eager, x.passes, x.whole, x.eager / x.whole, idle.c_str(),
                        100.0 * pipeline::theoretical_bubble(shape, x.m));
        }
        std::printf("\n| M | the rank's model | of which slots | whole-step graph of M |\n|---:|---:|---:|---:|\n");
        for (int m : memory_counts) std::printf("| %d | %.2f MiB | %.2f MiB | %.2f MiB |\n", m, memory[m].model, memory[m].slots, memory[m].whole);
    }
#if defined(BENCH_WITH_CUPTI)
    for (traced& t : traces)
        for (int r = 0; r < ranks; ++r) { // one rank at a time, so lines do not interleave
            if (r == rank) {
                const std::string prefix = std::string("trace, ") + t.way + ", M = " + std::to_string(t.m) + ", rank " + std::to_string(rank) + ": ";
                t.timeline.print(steps, prefix.c_str());
            }
            std::fflush(stdout);
            CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        }
#endif
    return 0;
}
