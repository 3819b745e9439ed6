// Tutorial 08: the example model on several GPUs, one process per GPU, started by MPI:
//
//   mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE ./08_data_parallel [--dot FILE]
//
// (alone, it is one rank). Each rank trains on its own batches of the reverse task. First data
// parallel: every rank holds every parameter, and a backward hook per layer all-reduces the
// layer's gradients in the last microbatch, on a side stream, captured in a graph of its own
// right after the layer's backward graph. Then sharded: each rank keeps half of every layer's
// parameters and optimizer state; a forward-pre hook all-gathers the layer into a static double
// buffer, a backward-pre hook gathers it again, and a backward hook reduce-scatters the
// gradients into the rank's shard. The mode is a type; the model and its layers are the same.
//
// Prints (rank 0) each plan with its hooks and collectives, the counters and the step times.
// Exits 1 unless the loss falls and every rank ends with the same weights, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/data_parallel.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cstdint>
#include <string_view>

using namespace capscope;

// [snippet configs]
// Per-layer graphs (Megatron's transformer_engine), the collectives captured with the layers.
using per_layer = config<impl::ahead_of_time_per_layer, modules<>, warmup_steps<2>>;
// Sharded: gathers land in a static double buffer (rules F1/F2 hold), gathered again for backward.
using sharded_policy = sharded<static_double_buffer, persistent_buffer, regather_for_backward>;
// [snippet configs]

//! Whether every rank holds the same numbers in `data` (a hash, its min and max over the ranks).
bool same_on_every_rank(const std::vector<float>& data) {
    const std::uint64_t h = cuda::fingerprint(std::string_view(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float)));
    std::uint64_t lo = h, hi = h;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
    return lo == hi;
}

template <class Mode>
bool train(const char* title, const cuda::nccl_communicator& comm, int rank, int ranks, const std::string& dot, cudaStream_t s) {
    // [snippet train]
    gpt::data_parallel_trainer<__nv_bfloat16, per_layer, Mode> trainer(tutorial::reverse_task_model("DEMD", 128, 32, 2), comm, s);
    auto& model = trainer.model();
    if (rank == 0) {
        std::printf("\n== %s on %d rank(s): %zu parameters, %.1f MiB of parameters and optimizer state on each rank ==\n", title, ranks,
                    model.parameters().total(), double(model.parameters().device_bytes()) / 1048576.0);
        std::fputs(trainer.runner().plan_text().c_str(), stdout);
        tutorial::write_dot(dot, trainer.runner().plan_dot());
    }
    std::mt19937 rng(11 + unsigned(rank)); // each rank its own data
    float first = 0, last = 0;
    for (int step = 0; step < 300; ++step) {
        tutorial::feed(model, rng, s);
        trainer.step(s);
        if (step == 0 || (step + 1) % 100 == 0) {
            last = model.loss(s);
            if (step == 0) first = last;
            if (rank == 0) std::printf("step %4d  loss %.4f (rank 0's batch)\n", step + 1, last);
        }
    }
    // [snippet train]
    const double ms = tutorial::median_step_ms(model, rng, s, 50, [&] { trainer.step(s); });
    // Data parallel: every rank holds every weight, and they must agree. Sharded: the ranks hold
    // different shards; what they share (embeddings, final norm, head) must agree.
    const auto arena = model.parameters().optimizer_arenas().front();
    std::vector<float> masters(arena.count);
    CAPSCOPE_CHECK(cudaMemcpy(masters.data(), arena.master, arena.count * sizeof(float), cudaMemcpyDeviceToHost));
    const bool same = same_on_every_rank(masters);
    const bool learnt = last < 0.5f * first;
    if (rank == 0) {
        tutorial::print_counters(title, trainer.runner().counters());
        std::printf("step time (median of 50): %.3f ms; weights the ranks share: %s; loss %.4f -> %.4f: %s\n", ms,
                    same ? "equal on every rank" : "DIFFER", first, last, learnt ? "learnt" : "LOSS DID NOT FALL ENOUGH");
    }
    return same && learnt;
}

int main(int argc, char** argv) {
    const auto args = tutorial::parse(argc, argv, "usage: 08_data_parallel [--dot FILE]");
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    // [snippet ranks]
    // An error on one rank is printed with the rank, and ends every rank (MPI_Abort) instead of
    // leaving the others waiting in a collective.
    return cuda::run_ranks([&](cuda::mpi_session& mpi) {
        const cuda::nccl_communicator comm = cuda::communicator_from_mpi(mpi); // before any stream or buffer
        cuda::stream s;
        const std::string dot = args.dot.empty() ? "" : args.dot[0];
        const bool dp = train<gpt::replicated>("data parallel", comm, mpi.rank(), mpi.size(), dot, s);
        const bool sh = train<sharded_policy>("sharded", comm, mpi.rank(), mpi.size(), "", s);
        return dp && sh ? 0 : 1;
    });
    // [snippet ranks]
}
