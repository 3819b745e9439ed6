#pragma once
//! @file
//! Where a rank sits when the world is pipeline ranks times data-parallel replicas (pure host).
//! Megatron-LM orders its groups tp-cp-ep-dp-pp: the replica runs fastest, so world rank
//! `replica + replicas * pipeline_rank`. A pipeline is the ranks of one replica; the ranks that
//! hold one pipeline rank's stages in every replica reduce their gradients together.

#include <stdexcept>
#include <string>

namespace capscope::pipeline {

struct grid_position {
    int pipeline_rank = 0; //!< the rank within its pipeline (its stages: schedule_shape::rank_of)
    int replica = 0;       //!< which pipeline replica it belongs to
    int replicas = 1;      //!< data-parallel replicas of the whole pipeline
    friend constexpr bool operator==(const grid_position&, const grid_position&) = default;
};

//! World rank `world_rank` of `world_size`, in pipelines of `pipeline_ranks` ranks.
constexpr grid_position position_in_grid(int world_rank, int world_size, int pipeline_ranks) {
    if (pipeline_ranks < 1 || world_size < 1 || world_size % pipeline_ranks != 0)
        throw std::invalid_argument("capscope pipeline: " + std::to_string(world_size) + " ranks do not split into pipelines of " +
                                    std::to_string(pipeline_ranks) + " -- fix: a world size that is a multiple of the pipeline ranks "
                                    "(Megatron's --pipeline-model-parallel-size divides the world size)");
    if (world_rank < 0 || world_rank >= world_size)
        throw std::out_of_range("capscope pipeline: rank " + std::to_string(world_rank) + " is outside a world of " + std::to_string(world_size));
    const int replicas = world_size / pipeline_ranks;
    return {world_rank / replicas, world_rank % replicas, replicas};
}

//! The world rank at `pipeline_rank` of replica `replica` (the inverse of position_in_grid).
constexpr int world_rank_of(int pipeline_rank, int replica, int replicas) { return replica + replicas * pipeline_rank; }

} // namespace capscope::pipeline
