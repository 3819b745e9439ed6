// Tutorial 15, the trainer: a two-stage pipeline on two GPUs, one process each, trained with 1F1B
// while the microbatch count changes every step (8, 12, 16), from graphs captured once. Each
// stage is y = x * w + 1/4 on a vector (examples/common/pipeline_kernels.cu); the last stage's
// loss is half the sum of its output's squares. The same training runs twice: eagerly (each
// step's program issued from the host) and from the phase graphs; their losses and weights must
// agree bit for bit. Before anything is sent, the replay check refuses a layout that would
// deadlock when a graph replays it.
//
//   mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 15_pipeline_trainer [steps]   (default 24)
//   exit 77 (skipped) without a CUDA device or as one rank, 2 with more ranks than two; two ranks
//   on a node with one GPU stop at communicator_from_mpi's error (one process per GPU)
#include "../common/pipeline_kernels.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <capscope/pipeline.hpp>
#include <capscope/pipeline/schedule_text.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using namespace capscope;
using pipeline::compute_action;
using pipeline::pass;
using pipeline::schedule_kind;
using pipeline::schedule_shape;

// [snippet trainer_schedule]
// Two ranks, one layer each, 1F1B; checked at compile time for the counts the run takes, in turn.
constexpr schedule_shape shape{.kind = schedule_kind::one_f_one_b, .ranks = 2, .layers = 2};
using schedule = pipeline_schedule<shape, 8, 12, 16>;
static_assert(schedule::communicators == pipeline::communicator_layout::shared); // Megatron's grouping: one communicator
constexpr auto& counts = schedule::declared_microbatches;
constexpr int most_microbatches = std::ranges::max(counts); // the samples a step loads, at most
// [snippet trainer_schedule]

namespace {

constexpr int n = 1 << 16; // floats per activation
constexpr float lr = 0.01f;

//! One rank's stage. Its buffers are addressed by the phase layout's slots (microbatch k lives in
//! activation slot k mod S and gradient slot k mod G on every count), so that graphs captured
//! for one count serve every count; the first stage loads its microbatch through a device
//! counter, since a captured host value never changes.
// [snippet trainer_stage]
struct stage {
    int rank;
    pipeline::phase_layout layout;
    cuda::device_buffer<float> w{n}, dw{n}, out{n}, grad_out{n}, pool;
    std::vector<cuda::device_buffer<float>> activations, gradients;
    cuda::device_buffer<int> counter{1};
    cuda::device_buffer<double> loss{1};

    stage(int r, cudaStream_t s) : rank(r), layout(pipeline::phase_layout_of(shape, r)), pool(r == 0 ? std::size_t(n) * most_microbatches : 1) {
        for (int k = 0; k < layout.activation_slots; ++k) activations.emplace_back(n);
        for (int k = 0; k < layout.gradient_slots; ++k) gradients.emplace_back(n);
        std::vector<float> host(std::size_t(n) * (r == 0 ? most_microbatches : 1));
        for (std::size_t i = 0; i < std::size_t(n); ++i) host[i] = 1.f + float(i % 17) / 170.f;
        w.copy_from_host(std::span<const float>(host.data(), std::size_t(n)), s);
        dw.fill_bytes(0, s);
        if (r == 0) { // every microbatch's sample, loaded on the device
            for (std::size_t i = 0; i < host.size(); ++i) host[i] = float((i * 7 + (i / n) * 31) % 29) / 29.f - 0.5f;
            pool.copy_from_host(host, s);
        }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vector goes
    }
    float* input(int mb) { return activations[std::size_t(layout.activation_slot(mb))].data(); }
    float* gradient(int mb) { return gradients[std::size_t(layout.gradient_slot(mb))].data(); }

    //! Where each send reads and each receive writes.
    p2p_buffer buffer_of(const pipeline::p2p_op& op) {
        const std::size_t bytes = std::size_t(n) * sizeof(float);
        if (op.m.what == pipeline::carries::activation) return {op.send ? out.data() : input(op.m.microbatch), bytes};
        return {op.send ? grad_out.data() : gradient(op.m.microbatch), bytes};
    }
    //! One pass: rank 0 loads, rank 1 adds its output to the loss and starts the backward from it.
    void run(const compute_action& a, cudaStream_t s) {
        float* x = input(a.microbatch);
        if (a.direction == pass::forward) {
            if (rank == 0) pipeline_kernels::load_next(pool.data(), counter.data(), x, n, s);
            pipeline_kernels::forward(x, w.data(), out.data(), n, s);
            if (rank == 1) pipeline_kernels::add_half_square(out.data(), loss.data(), n, s);
        } else if (rank == 1) {
            pipeline_kernels::last_backward(x, w.data(), dw.data(), grad_out.data(), n, s);
        } else {
            pipeline_kernels::backward(gradient(a.microbatch), x, w.data(), dw.data(), nullptr, n, s);
        }
    }
    void begin_step(cudaStream_t s) {
        counter.fill_bytes(0, s);
        loss.fill_bytes(0, s);
    }
    void end_step(cudaStream_t s) { pipeline_kernels::sgd(w.data(), dw.data(), lr, n, s); }
    double step_loss(cudaStream_t s) const {
        std::vector<double> host(1);
        loss.copy_to_host(host, s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        return host[0];
    }
};
// [snippet trainer_stage]

} // namespace

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 24;
    if (cuda::usable_device_count() == 0) return std::puts("no usable CUDA device: skipped"), cuda::skip_exit_code;
    cuda::mpi_session mpi;
    if (mpi.size() == 1) return std::puts("one rank: the pipeline has two stages (mpirun -np 2): skipped"), cuda::skip_exit_code;
    if (mpi.size() != shape.ranks) {
        if (mpi.rank() == 0) std::printf("this pipeline has %d stages, one per rank: run it with mpirun -np %d, not %d\n", shape.ranks, shape.ranks, mpi.size());
        return 2;
    }
    const cuda::nccl_communicator comm = cuda::communicator_from_mpi(mpi);
    const int rank = mpi.rank();
    cuda::stream s;
    if (rank == 0) std::printf("%s\n", pipeline::schedule_text(shape, 8).c_str());

    // [snippet trainer_refused]
    // The replay check, before anything is sent: an interleaved schedule whose sends and receives
    // are paired pass by pass would deadlock on one shared communicator when a graph replays it.
    // (Left to choose, `communicator_choice::automatic`, it gets a communicator per edge and runs.)
    const schedule_shape paired{.kind = schedule_kind::interleaved_1f1b, .ranks = 2, .virtual_stages = 2, .layers = 4,
                                .communicators = pipeline::communicator_choice::shared, .grouping = pipeline::p2p_grouping::paired};
    try {
        const pipeline_p2p refused(comm, paired, 4);
        std::printf("rank %d: the paired layout was accepted, which it must not be\n", rank);
        return 1;
    } catch (const std::invalid_argument& e) {
        if (rank == 0) std::printf("refused before anything is sent: %s\n\n", e.what());
    }
    // [snippet trainer_refused]

    // [snippet trainer_train]
    std::map<int, pipeline_p2p> programs; // the eager pipeline: each count's whole program
    for (int m : counts) programs.emplace(m, pipeline_p2p(comm, shape, m));
    stage eager(rank, s), graphed(rank, s);
    auto buffers = [&](const pipeline::p2p_op& op) { return graphed.buffer_of(op); };
    auto passes = [&](const compute_action& a, cudaStream_t on) { graphed.run(a, on); };

    pipeline_phase_graphs phases(comm, shape);
    int launches = 0;
    bool same = true;
    for (int t = 0; t < steps; ++t) {
        const int m = counts[std::size_t(t) % counts.size()];
        eager.begin_step(s);
        programs.at(m).run([&](const pipeline::p2p_op& op) { return eager.buffer_of(op); },
                           [&](const compute_action& a, cudaStream_t on) { eager.run(a, on); }, s);
        eager.end_step(s);

        graphed.begin_step(s);
        if (t == 0) { // NCCL opens its connections on the first send: one eager step, then the capture
            programs.at(m).run(buffers, passes, s);
            phases.capture(buffers, passes, s);
        } else {
            phases.launch(m, s, [&](cudaStream_t) { ++launches; });
        }
        graphed.end_step(s);

        const double a = eager.step_loss(s), b = graphed.step_loss(s);
        same = same && a == b;
        if (rank == 1 && (t % 6 == 0 || t == steps - 1))
            std::printf("step %2d, %2d microbatches: loss %.6f eager, %.6f from the graphs%s\n", t, m, a, b, a == b ? "" : "  DIFFERENT");
    }
    // [snippet trainer_train]
    std::vector<float> we(n), wg(n);
    eager.w.copy_to_host(we, s);
    graphed.w.copy_to_host(wg, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    same = same && we == wg;
    int mine = same ? 1 : 0, all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    std::fflush(stdout);
    CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    std::string cycle;
    for (int m : counts) cycle += (cycle.empty() ? "" : " -> ") + std::to_string(m);
    const int steady = phases.layout().period, tails = phases.graphs_captured() - 1 - steady; // the rest after the warmup
    if (rank == 0)
        std::printf("%d steps, counts %s: %d phase graphs captured once on rank 0 (warmup, %d steady, %d tails), %d launches; "
                    "losses and weights %s\n",
                    steps, cycle.c_str(), phases.graphs_captured(), steady, tails, launches,
                    all ? "bitwise equal to the eager pipeline on every rank" : "DIFFERENT from the eager pipeline");
    return all ? 0 : 1;
}
