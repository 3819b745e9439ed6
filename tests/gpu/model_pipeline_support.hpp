#pragma once
// The pipelined example model's GPU tests share this: a model trained some steps under one impl,
// on a pipeline communicator (the world's, or a replica's), with the batches a test chooses.

#include <capscope/cuda/graph.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_pass_graphs.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <optional>
#include <vector>

namespace model_pipeline {

//! Whether `mine` holds on every rank (every rank calls it).
inline bool all_ranks(bool mine) {
    int ok = mine ? 1 : 0, all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all == 1;
}

//! Every chunk's fp32 masters, one after another (synchronizes `s`).
inline std::vector<float> masters_of(const gpt::pipeline_model<float>& m, cudaStream_t s) {
    std::vector<float> out;
    for (int c = 0; c < m.chunks(); ++c) {
        const gpt::parameter_store<float>& p = m.parameters(c);
        std::vector<float> chunk(p.total());
        CAPSCOPE_CHECK(cudaMemcpyAsync(chunk.data(), p.masters(), chunk.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        out.insert(out.end(), chunk.begin(), chunk.end());
    }
    return out;
}

enum class impl { eager, local, transformer_engine, full_iteration };
inline constexpr const char* impl_names[] = {"eager", "local", "transformer_engine", "full_iteration"};

//! `steps` steps of `model` under `how`: eager, each pass from its graph (local: captured at first
//! use; transformer_engine: all first), or the whole step as one graph after one eager step (NCCL
//! opens its connections on the first send). Before each step `set_batches(step)` loads the
//! microbatches, and after it `after_step(step)` may read the loss.
template <class SetBatches, class AfterStep>
void run_steps(gpt::pipeline_model<float>& model, const capscope::cuda::nccl_communicator& pipeline, const capscope::pipeline::schedule_shape& shape,
               impl how, int steps, cudaStream_t s, SetBatches&& set_batches, AfterStep&& after_step) {
    const int microbatches = model.config().microbatches;
    std::optional<capscope::pipeline_p2p> p2p;
    std::optional<capscope::pipeline_pass_graphs> passes;
    if (how == impl::local || how == impl::transformer_engine)
        passes.emplace(pipeline, shape, microbatches, how == impl::local ? capscope::pass_capture::lazily : capscope::pass_capture::ahead_of_time);
    else p2p.emplace(pipeline, shape, microbatches);
    std::optional<capscope::cuda::graph_exec> whole_step;
    for (int t = 0; t < steps; ++t) {
        set_batches(t);
        if (passes) model.step(*passes, s);
        else if (how == impl::eager || t == 0) model.step(*p2p, s);
        else {
            if (!whole_step) whole_step.emplace(capscope::cuda::capture(s, [&](cudaStream_t on) { model.step(*p2p, on); }));
            whole_step->launch(s);
        }
        after_step(t);
    }
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    if (passes) CHECK(passes->graphs_captured() == passes->distinct_passes());
}

} // namespace model_pipeline
