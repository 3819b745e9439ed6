// A 1F1B pipeline step on 2 GPUs (one process each), four ways side by side in one run:
//   eager   capscope's eager pipeline: each step's program (pipeline_p2p) issued from the host,
//           with its sends and receives as NCCL groups
//   passes  pipeline_pass_graphs: each pass replayed from its graph (per direction and slot), the
//           sends and receives eager between them (the local and transformer_engine impls)
//   whole   the whole step captured as one graph, one graph per microbatch count
//   phases  pipeline_phase_graphs: warmup, steady and tail graphs captured once, for every count
// The model is tests/mpi/pipeline_stage.hpp's (y = x * w + 1/4 per stage), each pass weighted by
// `--work` dependent multiply-adds per element (a stand-in for a layer's compute).
//
// Per count M (8 and 32): the step time (device time between events, median of the rounds; the
// slowest rank's), and each rank's idle share of the phases' step against the theoretical
// bubble (p - 1) / (M + p - 1). The idle share is 1 - busy / step, where busy is the rank's
// passes alone, captured and timed without sends and receives. Memory per M (8, 16, 32, 64):
// the device memory that the phase graphs hold (captured once), that the whole-step graph of that
// count holds, and what launching the phases at each count adds.
//
// With --trace (CUPTI), each rank's whole-step graph at each timed count is traced after the
// timing: compute kernels busy, NCCL kernels, the NCCL time no compute kernel overlaps, and the
// time no kernel runs, per step (bench/kernel_timeline.hpp). That says where the idle goes.
//
//   mpirun -np 2 pipeline [--floats N] [--work K] [--rounds R] [--trace]     exit 77 without 2 GPUs

#include "arguments.hpp"
#include "mpi_timing.hpp"
#include "round_robin.hpp"

#include "../tests/gpu/mpi_support.hpp"
#if defined(BENCH_WITH_CUPTI)
#include "kernel_timeline.hpp"
#endif
#include "../tests/mpi/pipeline_stage.hpp"

#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_pass_graphs.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <capscope/pipeline/schedule_text.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace capscope;
using namespace pipeline_model;

namespace {

struct rank_model {
    stage_state state;
    cuda::device_buffer<float> scratch;
    int n, work;
    rank_model(int n_, int work_, int rank, int ranks, const pipeline::slot_plan& plan, int most, const pipeline::phase_layout& layout, cudaStream_t s)
        : state(n_, rank, ranks, 1, plan, most, s, layout), scratch(std::size_t(n_)), n(n_), work(work_) {
        scratch.fill_bytes(0, s);
    }
    void pass(const compute_action& a, cudaStream_t s) {
        if (work > 0) pipeline_kernels::burn(scratch.data(), n, work, s);
        state.run(a, s);
    }
    auto buffers() {
        return [this](const pipeline::p2p_op& op) { return state.buffer_of(op); };
    }
    auto passes() {
        return [this](const compute_action& a, cudaStream_t on) { pass(a, on); };
    }
    void step(const pipeline_p2p& p2p, cudaStream_t s) {
        state.counter.fill_bytes(0, s);
        p2p.run(buffers(), passes(), s);
        state.optimizer(s);
    }
};

using bench::gather;
using bench::max_over_ranks;
using bench::time_steps;

constexpr double mib = 1024.0 * 1024.0;

} // namespace

int main(int argc, char** argv) {
    int n = 1 << 20, work = 2000, rounds = 7;
    bench::arguments args("pipeline");
    bool trace = false;
    args.integer("--floats", n, 256).integer("--work", work, 0).integer("--rounds", rounds, 1).flag("--trace", trace).parse_or_exit(argc, argv);
#if !defined(BENCH_WITH_CUPTI)
    if (trace) args.refuse("--trace needs CUPTI, which this build did not find");
#endif
    const std::string device = bench::device_or_skip();
    if (cuda::usable_device_count() < 2) return std::printf("one GPU: a pipeline needs two (mpirun -np 2): skipped\n"), 77;
    support::comm();
    const int ranks = support::comm().size(), rank = support::comm().rank();
    if (ranks < 2) return std::printf("one rank: a pipeline needs two (mpirun -np 2): skipped\n"), 77;
    const pipeline::schedule_shape shape{pipeline::schedule_kind::one_f_one_b, ranks, 1, ranks};
    const std::vector<int> timed_counts{8, 32}, memory_counts{8, 16, 32, 64};
    const int most = 64, steps = 5;
    cuda::stream s;

    const pipeline::phase_layout layout = pipeline::phase_layout_of(shape, rank);
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, most);
    rank_model model(n, work, rank, ranks, plan, most, layout, s), busy_model(n, work, rank, ranks, plan, most, layout, s);
    std::map<int, pipeline_p2p> programs;
    for (int m : memory_counts) programs.emplace(m, pipeline_p2p(support::comm(), shape, m));
    model.step(programs.at(8), s); // NCCL opens its connections eagerly, before any capture
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));

    // Memory: the phase graphs, captured once; then each count's whole-step graph.
    const std::size_t before_phases = bench::device_used();
    pipeline_phase_graphs phases(support::comm(), shape);
    phases.capture(model.buffers(), model.passes(), s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const double phase_mib = double(bench::device_used() - before_phases) / mib;
    std::map<int, cuda::graph_exec> whole;
    std::map<int, double> whole_mib, phase_growth_mib;
    for (int m : memory_counts) {
        const std::size_t before = bench::device_used();
        const cuda::graph g = cuda::capture(s, [&](cudaStream_t on) { model.step(programs.at(m), on); });
        whole.emplace(m, cuda::graph_exec(g));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        whole_mib[m] = max_over_ranks(double(bench::device_used() - before) / mib);
    }
    for (int m : memory_counts) {
        const std::size_t before = bench::device_used();
        for (int t = 0; t < 3; ++t) {
            model.state.counter.fill_bytes(0, s);
            phases.launch(m, s);
            model.state.optimizer(s);
        }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        phase_growth_mib[m] = max_over_ranks(double(bench::device_used()) / mib - double(before) / mib);
    }
    const double phase_mib_all = max_over_ranks(phase_mib);

    // Step time, the three ways round-robin per count, and each rank's passes alone.
    struct row {
        int m;
        double eager, passes, whole, phases;
        std::vector<double> idle;
    };
    std::vector<row> rows;
    for (int m : timed_counts) {
        const pipeline_p2p& p2p = programs.at(m);
        const std::vector<pipeline::compute_action> order = pipeline::compute_order(shape, rank, m);
        const cuda::graph busy_graph = cuda::capture(s, [&](cudaStream_t on) {
            busy_model.state.counter.fill_bytes(0, on);
            for (const compute_action& a : order) busy_model.pass(a, on);
        });
        const cuda::graph_exec busy_exec(busy_graph);
        pipeline_pass_graphs pass_graphs(support::comm(), shape, m, pass_capture::ahead_of_time);
        // The model addresses by the phase layout's slots; the pass graphs are keyed by theirs. 1F1B's
        // are the same (k mod S, k mod G), else a replay would use buffers its capture did not.
        for (int k = 0; k < m; ++k) {
            const int slot = pass_graphs.activation_slot(0, k), gradient = pass_graphs.gradient_slot(0, k);
            if (slot != layout.activation_slot(k) || (gradient >= 0 && gradient != layout.gradient_slot(k)))
                throw std::logic_error("rank " + std::to_string(rank) + ", M = " + std::to_string(m) + ", microbatch " + std::to_string(k) +
                                       ": the pass graphs key it by slots " + std::to_string(slot) + "/" + std::to_string(gradient) +
                                       ", the model addresses it by " + std::to_string(layout.activation_slot(k)) + "/" +
                                       std::to_string(layout.gradient_slot(k)) +
                                       " -- fix: give the per-pass graphs a model addressed by pipeline_pass_graphs::activation_slot and gradient_slot");
        }
        auto pass_step = [&](cudaStream_t on) {
            model.state.counter.fill_bytes(0, on);
            pass_graphs.step(model.buffers(), model.passes(), on);
            model.state.optimizer(on);
        };
        pass_step(s); // captured ahead of the first step, outside the timing
        std::vector<double> eager, graph, phased, busy, per_pass;
        for (int r = 0; r < rounds; ++r) {
            eager.push_back(time_steps([&](cudaStream_t on) { model.step(p2p, on); }, 1, steps, s));
            per_pass.push_back(time_steps(pass_step, 1, steps, s));
            graph.push_back(time_steps([&](cudaStream_t on) { whole.at(m).launch(on); }, 1, steps, s));
            phased.push_back(time_steps([&](cudaStream_t on) {
                model.state.counter.fill_bytes(0, on);
                phases.launch(m, on);
                model.state.optimizer(on);
            }, 1, steps, s));
            busy.push_back(time_steps([&](cudaStream_t on) { busy_exec.launch(on); }, 1, steps, s));
        }
        row x{m, max_over_ranks(bench::median(eager)), max_over_ranks(bench::median(per_pass)), max_over_ranks(bench::median(graph)), max_over_ranks(bench::median(phased)), {}};
        const double idle = 1.0 - bench::median(busy) / x.phases;
        x.idle = gather(idle, ranks);
        rows.push_back(x);
    }

    if (rank == 0) {
        std::printf("1f1b pipeline, %d ranks, %s; %d floats a message (%.1f MiB), --work %d\n", ranks, device.c_str(), n, double(n) * 4 / mib, work);
        std::printf("\n| M | eager pipeline | per-pass graphs | whole-step graph | phases (captured once) | eager / whole | idle per rank (phases) | bubble in theory |\n");
        std::printf("|---:|---:|---:|---:|---:|---:|---|---:|\n");
        for (const row& x : rows) {
            std::string idle;
            for (double v : x.idle) idle += (idle.empty() ? "" : ", ") + std::to_string(int(v * 1000 + 0.5) / 10) + "." + std::to_string(int(v * 1000 + 0.5) % 10) + "%";
            std::printf("| %d | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.2fx | %s | %.1f%% |\n", x.m, x.eager, x.passes, x.whole, x.phases, x.eager / x.whole, idle.c_str(),
                        100.0 * pipeline::theoretical_bubble(shape, x.m));
        }
        std::printf("\n| M | phase graphs (captured once) | launching them at M adds | whole-step graph of M |\n|---:|---:|---:|---:|\n");
        for (int m : memory_counts)
            std::printf("| %d | %.2f MiB | %.2f MiB | %.2f MiB |\n", m, phase_mib_all, phase_growth_mib[m], whole_mib[m]);
    }
#if defined(BENCH_WITH_CUPTI)
    for (int m : trace ? timed_counts : std::vector<int>{}) { // after the timing: tracing slows the host
        bench::kernel_timeline timeline;
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        timeline.start();
        (void)time_steps([&](cudaStream_t on) { whole.at(m).launch(on); }, 1, steps, s);
        timeline.stop();
        for (int r = 0; r < ranks; ++r) { // one rank at a time, so lines do not interleave
            if (r == rank) {
                const std::string prefix = "trace, whole-step graph, M = " + std::to_string(m) + ", rank " + std::to_string(rank) + ": ";
                timeline.print(steps, prefix.c_str());
            }
            std::fflush(stdout);
            CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        }
    }
#endif
    return 0;
}
