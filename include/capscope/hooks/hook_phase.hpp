#pragma once
//! @file
//! The four phases a hook runs in, around a layer (or one capture region of it): before and
//! after its forward, before and after its backward. Megatron's FSDP attaches its handlers at
//! exactly these points (PR #4232); here the phase is part of the hook's type.

#include <capscope/plan/segment.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

enum class hook_phase : std::uint8_t { forward_pre, forward, backward_pre, backward };

constexpr std::string_view hook_phase_name(hook_phase p) {
    switch (p) {
    case hook_phase::forward_pre: return "forward_pre";
    case hook_phase::forward: return "forward";
    case hook_phase::backward_pre: return "backward_pre";
    case hook_phase::backward: return "backward";
    }
    return "?";
}

//! The pass a hook of phase `p` runs in.
constexpr phase pass_of(hook_phase p) {
    return p == hook_phase::forward_pre || p == hook_phase::forward ? phase::forward : phase::backward;
}

} // namespace capscope
