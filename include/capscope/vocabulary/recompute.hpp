#pragma once
//! @file
//! Activation recomputation, as far as CUDA-graph rules read it.

#include <capscope/detail/enum_names.hpp>
#include <capscope/detail/enum_set.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

//! `--recompute-granularity`: `full` recomputes whole layers, `selective` the listed modules.
enum class recompute_granularity : std::uint8_t { full, selective };

template <>
struct enum_names<recompute_granularity> {
    static constexpr std::string_view megatron[] = {"full", "selective"};
    static constexpr std::string_view cpp[] = {"full", "selective"};
};

//! `--recompute-modules` entries.
enum class recompute_module : std::uint8_t {
    core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts
};

template <>
struct enum_names<recompute_module> {
    static constexpr std::string_view megatron[] = {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                                    "mlp", "moe", "shared_experts"};
    static constexpr std::string_view cpp[] = {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                               "mlp", "moe", "shared_experts"};
};

using recompute_module_set = detail::enum_set<recompute_module>;

//! `--recompute-method` (read by no CUDA-graph rule; carried so the configuration is complete).
enum class recompute_method : std::uint8_t { uniform, block };

template <>
struct enum_names<recompute_method> {
    static constexpr std::string_view megatron[] = {"uniform", "block"};
    static constexpr std::string_view cpp[] = {"uniform", "block"};
};

} // namespace capscope
