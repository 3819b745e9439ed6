// The example model pipelined on data-parallel replicas of the pipeline (mpirun -np 4, or any even
// count of 4 or more: pipelines of 2 ranks; fewer ranks skip). The world splits as Megatron orders
// it (capscope::split_pipeline_grid), each replica trains on batches of its own, and every step
// averages each chunk's gradients over the replicas (gpt::pipeline_model::average_gradients_over),
// inside the step. Three things must hold, on every rank:
// - every impl (local, transformer_engine, full_iteration, the average inside the graphs) is
//   bitwise equal to eager;
// - the replicas stay bitwise equal to each other;
// - and equal, within 1e-5, to one pipeline trained on every replica's microbatches at once.
// Broken on purpose (CAPSCOPE_BREAK=skip_replica_average) the replicas drift apart.

#include "model_pipeline_support.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_grid.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;
using support::comm;
namespace pl = capscope::pipeline;

namespace {

constexpr int steps = 3, microbatches = 4;
using model_pipeline::impl;
using model_pipeline::impl_names;

gpt::model_config replicated_model(int mbs) {
    gpt::model_config c = support::small_model("DEMD", gpt::moe_mode::drop_and_pad, 1.25);
    c.batch = 2;
    c.microbatches = mbs;
    return c;
}

//! Replica `replica`'s microbatch `mb` of step `step` (two sets of batches in turn).
support::batch batch_of(const gpt::model_config& c, int step, int replica, int mb) {
    return support::random_batch(c.batch, c.seq_len, c.vocab, 9000u + std::uint64_t(step % 2) * 131u + std::uint64_t(replica) * 17u + std::uint64_t(mb));
}

using model_pipeline::masters_of;

//! `replicated`: this replica's microbatches, averaged over the replicas; else (the reference)
//! every replica's microbatches in one step, replica after replica, on this replica's pipeline.
std::vector<float> train(pipeline_grid& grid, const pl::schedule_shape& shape, impl how, bool replicated, cudaStream_t s) {
    const gpt::model_config cfg = replicated_model(replicated ? microbatches : microbatches * grid.at.replicas);
    gpt::pipeline_model<float> model(cfg, shape, grid.at.pipeline_rank, s);
    if (replicated) model.average_gradients_over(grid.replicas);
    model_pipeline::run_steps(
        model, grid.pipeline, shape, how, steps, s,
        [&](int t) {
            for (int mb = 0; mb < cfg.microbatches; ++mb) {
                const int replica = replicated ? grid.at.replica : mb / microbatches, own = replicated ? mb : mb % microbatches;
                const support::batch b = batch_of(cfg, t, replica, own);
                model.set_batch(mb, b.tokens, b.labels, s);
            }
        },
        [](int) {});
    return masters_of(model, s);
}

using model_pipeline::all_ranks;

void check_replicas(pipeline_grid& grid, const pl::schedule_shape& shape) {
    cuda::stream s;
    const std::vector<float> eager = train(grid, shape, impl::eager, true, s);
    std::string verdicts;
    bool every_impl = true;
    for (impl how : {impl::local, impl::transformer_engine, impl::full_iteration}) {
        const bool same = all_ranks(train(grid, shape, how, true, s) == eager);
        verdicts += std::string(", eager ") + (same ? "=" : "!=") + " " + impl_names[int(how)];
        every_impl = every_impl && same;
    }
    // The replicas of one pipeline rank, on MPI: replica 0's masters against each other's.
    MPI_Comm group = MPI_COMM_NULL;
    CAPSCOPE_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, grid.at.pipeline_rank, grid.at.replica, &group));
    std::vector<float> first = eager;
    CAPSCOPE_MPI_CHECK(MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, group));
    CAPSCOPE_MPI_CHECK(MPI_Comm_free(&group));
    const bool replicas_equal = all_ranks(first == eager);
    // One pipeline on every replica's microbatches at once.
    const std::vector<float> reference = train(grid, shape, impl::eager, false, s);
    double diff = reference.size() == eager.size() ? 0.0 : 1.0;
    for (std::size_t i = 0; diff < 1.0 && i < eager.size(); ++i) diff = std::max(diff, double(std::fabs(reference[i] - eager[i])));
    double largest = diff;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&diff, &largest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    if (comm().rank() == 0) {
        std::printf("example model pipelined on %d replicas of %s, %d ranks%s, pattern DEMD, %d microbatches a replica, %d steps%s; replicas %s; "
                    "against one pipeline on all %d microbatches: largest weight difference %.3g\n",
                    grid.at.replicas, std::string(pl::name_of(shape.kind)).c_str(), shape.ranks,
                    shape.virtual_stages > 1 ? (" x " + std::to_string(shape.virtual_stages) + " chunks").c_str() : "", microbatches, steps,
                    verdicts.c_str(), replicas_equal ? "bitwise equal" : "DIFFER", microbatches * grid.at.replicas, largest);
        std::fflush(stdout);
    }
    CHECK_MESSAGE(every_impl, "an impl differs from the eager pipeline");
    CHECK(replicas_equal);
    CHECK(largest <= 1e-5);
}

} // namespace

TEST_CASE("the example model pipelined on data-parallel replicas of the pipeline: every impl, the replicas equal, one pipeline's result") {
    const int world = comm().size();
    if (world < 4 || world % 2 != 0) {
        MESSAGE("pipeline replicas need mpirun -np 4 (or more, an even count)");
        return;
    }
    pipeline_grid grid = split_pipeline_grid(comm(), 2);
    check_replicas(grid, {.kind = pl::schedule_kind::one_f_one_b, .ranks = 2, .layers = 4});
    check_replicas(grid, {.kind = pl::schedule_kind::interleaved_1f1b, .ranks = 2, .virtual_stages = 2, .layers = 4});
}
