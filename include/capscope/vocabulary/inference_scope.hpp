#pragma once
//! @file
//! Who owns inference graphs (Megatron's `InferenceCudaGraphScope`).
//! `eager` = `none`, `per_layer` = `layer`, `per_block` = `block`.

#include <capscope/detail/enum_names.hpp>

#include <cstdint>
#include <string_view>

namespace capscope {

enum class inference_scope : std::uint8_t { eager, per_layer, per_block };

template <>
struct enum_names<inference_scope> {
    static constexpr std::string_view megatron[] = {"none", "layer", "block"};
    static constexpr std::string_view cpp[] = {"eager", "per_layer", "per_block"};
};

} // namespace capscope
