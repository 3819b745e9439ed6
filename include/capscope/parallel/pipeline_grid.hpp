#pragma once
//! @file
//! The world's communicator split for pipeline replicas (Megatron's order,
//! capscope/pipeline/process_grid.hpp): this rank's pipeline, which `pipeline_p2p` issues on (and
//! splits its edges from), and its replica group, over which each step's gradients are averaged.
//! Both are split from the world's, so aborting it (the step watchdog) aborts them too.

#include <capscope/cuda/nccl.hpp>
#include <capscope/pipeline/process_grid.hpp>

#include <stdexcept>
#include <utility>

namespace capscope {

struct pipeline_grid {
    pipeline::grid_position at;
    cuda::nccl_communicator pipeline; //!< the ranks of this replica, ranked by pipeline rank
    cuda::nccl_communicator replicas; //!< the ranks at this pipeline rank, one per replica, ranked by replica
};

//! Every rank of `world` calls it, in the same order as its other collectives.
inline pipeline_grid split_pipeline_grid(const cuda::nccl_communicator& world, int pipeline_ranks) {
    const pipeline::grid_position at = pipeline::position_in_grid(world.rank(), world.size(), pipeline_ranks);
    std::optional<cuda::nccl_communicator> pipe = cuda::nccl_communicator::split(world, at.replica, at.pipeline_rank);
    std::optional<cuda::nccl_communicator> group = cuda::nccl_communicator::split(world, at.pipeline_rank, at.replica);
    if (!pipe || !group) throw std::logic_error("capscope pipeline: ncclCommSplit gave no communicator to a rank of the grid");
    return {at, std::move(*pipe), std::move(*group)};
}

} // namespace capscope
