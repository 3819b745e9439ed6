#pragma once
// What the multi-rank benchmarks share: a figure's largest value over the ranks, every rank's
// value, and the device time per step of a step launched on every rank in step.

#include "round_robin.hpp"

#include <capscope/cuda/event.hpp>
#include <capscope/parallel/mpi_bootstrap.hpp>

#include <functional>
#include <vector>

namespace bench {

inline double max_over_ranks(double mine) {
    double all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return all;
}

inline std::vector<double> gather(double mine, int ranks) {
    std::vector<double> all(static_cast<std::size_t>(ranks), 0.0);
    CAPSCOPE_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD));
    return all;
}

//! Device ms per step of `launch_step` (median over rounds of `steps` steps), every rank in step.
inline double time_steps(const std::function<void(cudaStream_t)>& launch_step, int rounds, int steps, cudaStream_t s) {
    std::vector<double> ms;
    const capscope::cuda::event start = capscope::cuda::event::timing(), stop = capscope::cuda::event::timing();
    for (int r = 0; r < rounds; ++r) {
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        CAPSCOPE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        start.record(s);
        for (int t = 0; t < steps; ++t) launch_step(s);
        stop.record(s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        float elapsed = 0;
        CAPSCOPE_CHECK(cudaEventElapsedTime(&elapsed, start.get(), stop.get()));
        ms.push_back(double(elapsed) / steps);
    }
    return median(ms);
}

} // namespace bench
