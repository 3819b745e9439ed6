#pragma once
// The pipeline unit tests' shorthand for schedule shapes: 1F1B and interleaved over `ranks`, one
// layer a chunk, and a shape with its sends and receives grouped another way.

#include <capscope/pipeline/schedule_shape.hpp>

namespace pipeline_shapes {

using capscope::pipeline::p2p_grouping;
using capscope::pipeline::schedule_kind;
using capscope::pipeline::schedule_shape;

inline schedule_shape one_f_one_b(int ranks) { return {schedule_kind::one_f_one_b, ranks, 1, ranks}; }
inline schedule_shape interleaved(int ranks, int chunks, int group = 0) {
    return {schedule_kind::interleaved_1f1b, ranks, chunks, ranks * chunks, group};
}
inline schedule_shape grouped(schedule_shape s, p2p_grouping g) {
    s.grouping = g;
    return s;
}
inline constexpr p2p_grouping paired = p2p_grouping::paired, one_by_one = p2p_grouping::one_by_one;

//! A shape drawn from `rng`: 2 to ranks + 1 ranks, 1 to `chunks` chunks (interleaved past one,
//! else 1F1B or GPipe at random), a layer a chunk, interleaved in groups of the ranks plus 0 to
//! extra_group - 1. The rules may still refuse it for a microbatch count (check_shape).
template <class Rng>
schedule_shape random_shape(Rng& rng, int ranks, int chunks, int extra_group) {
    const int p = 2 + int(rng() % unsigned(ranks)), v = 1 + int(rng() % unsigned(chunks));
    const schedule_kind kind = v > 1 ? schedule_kind::interleaved_1f1b : (rng() % 2 ? schedule_kind::one_f_one_b : schedule_kind::gpipe);
    return {kind, p, v, p * v, v > 1 ? p + int(rng() % unsigned(extra_group)) : 0};
}

} // namespace pipeline_shapes
