#pragma once
//! @file
//! Module inputs that fine-grained activation offloading can copy to pinned host memory
//! (Megatron's `offload_modules`). Names are Megatron's.

#include <capscope/detail/enum_names.hpp>
#include <capscope/detail/enum_set.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

enum class offload_module : std::uint8_t {
    attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp, gdp_qkv
};

template <>
struct enum_names<offload_module> {
    static constexpr std::string_view megatron[] = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                                                    "expert_fc1", "moe_act", "fused_group_mlp", "gdp_qkv"};
    static constexpr std::string_view cpp[] = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                                               "expert_fc1", "moe_act", "fused_group_mlp", "gdp_qkv"};
};

using offload_module_set = detail::enum_set<offload_module>;

//! The MoE expert inputs whose shapes are unknown in advance (they bypass the pinned pool).
inline constexpr offload_module_set moe_expert_offloads{offload_module::expert_fc1, offload_module::moe_act,
                                                        offload_module::fused_group_mlp};

} // namespace capscope
