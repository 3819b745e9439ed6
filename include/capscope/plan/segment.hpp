#pragma once
//! @file
//! The plan's vocabulary: the phase of a stage call, and a segment, a maximal run of
//! consecutive stage calls that becomes one graph or stays an eager island.

#include <cstdint>
#include <string_view>

namespace capscope {

enum class phase : std::uint8_t { forward, backward };

constexpr std::string_view phase_name(phase p) { return p == phase::forward ? "forward" : "backward"; }

//! Where in a training step a stage list runs.
enum class step_part : std::uint8_t { step_begin, microbatch, step_end };

//! A run of consecutive stages in one list, [first, first + count): forward runs it in order,
//! backward in reverse.
struct stage_range {
    int first = 0;
    int count = 0;
    bool graphed = false;
    friend constexpr bool operator==(const stage_range&, const stage_range&) = default;
};

} // namespace capscope
