#pragma once
//! @file
//! Per-layer capture regions (Megatron's `CudaGraphModule`). An empty set means "capture the
//! whole layer". Names are Megatron's except `attention` (Megatron: `attn`).

#include <capscope/detail/enum_names.hpp>
#include <capscope/detail/enum_set.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

enum class capture_module : std::uint8_t { attention, mlp, moe, moe_router, moe_preprocess, mamba };

template <>
struct enum_names<capture_module> {
    static constexpr std::string_view megatron[] = {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"};
    static constexpr std::string_view cpp[] = {"attention", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"};
};

using capture_module_set = detail::enum_set<capture_module>;

} // namespace capscope
