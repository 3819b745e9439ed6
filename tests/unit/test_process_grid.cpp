// Pipeline replicas in Megatron's order (capscope/pipeline/process_grid.hpp): the replica runs
// fastest, each pipeline holds one rank of every pipeline rank, and a world that does not split
// is refused with the fix.

#include <capscope/pipeline/process_grid.hpp>

#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <utility>

using namespace capscope::pipeline;

TEST_CASE("process grid: Megatron's order, replica fastest; every (pipeline rank, replica) once; refusals") {
    // 8 ranks, pipelines of 4: Megatron's pipeline groups are [0, 2, 4, 6] and [1, 3, 5, 7].
    static_assert(position_in_grid(0, 8, 4) == grid_position{0, 0, 2});
    static_assert(position_in_grid(1, 8, 4) == grid_position{0, 1, 2});
    static_assert(position_in_grid(6, 8, 4) == grid_position{3, 0, 2});
    static_assert(position_in_grid(7, 8, 4) == grid_position{3, 1, 2});
    for (int world : {1, 2, 4, 6, 8, 12, 16})
        for (int pipeline_ranks = 1; pipeline_ranks <= world; ++pipeline_ranks) {
            if (world % pipeline_ranks) {
                CHECK_THROWS_AS((void)position_in_grid(0, world, pipeline_ranks), std::invalid_argument);
                continue;
            }
            std::set<std::pair<int, int>> seen;
            for (int r = 0; r < world; ++r) {
                const grid_position at = position_in_grid(r, world, pipeline_ranks);
                CHECK(at.replicas == world / pipeline_ranks);
                CHECK(world_rank_of(at.pipeline_rank, at.replica, at.replicas) == r);
                seen.insert({at.pipeline_rank, at.replica});
            }
            CHECK(seen.size() == std::size_t(world));
        }
    CHECK_THROWS_WITH_AS((void)position_in_grid(0, 6, 4),
                         "capscope pipeline: 6 ranks do not split into pipelines of 4 -- fix: a world size that is a multiple of the pipeline ranks "
                         "(Megatron's --pipeline-model-parallel-size divides the world size)",
                         std::invalid_argument);
    CHECK_THROWS_AS((void)position_in_grid(8, 8, 4), std::out_of_range);
}
