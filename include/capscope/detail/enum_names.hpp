#pragma once
//! @file
//! Megatron spellings of capscope's enums. Each vocabulary header specialises
//! `enum_names<E>` with the spellings in declaration order; `megatron_name` and
//! `parse_megatron_name` are then the only way names are printed or read, so the CLI,
//! the JSON output and `--emit-cpp` cannot drift apart.

#include <cstddef>
#include <optional>
#include <string_view>

namespace capscope {

template <class Enum>
struct enum_names; // specialised next to each enum: static constexpr std::string_view megatron[]

template <class Enum>
constexpr std::string_view megatron_name(Enum e) {
    return enum_names<Enum>::megatron[static_cast<std::size_t>(e)];
}

template <class Enum>
constexpr std::optional<Enum> parse_megatron_name(std::string_view text) {
    std::size_t i = 0;
    for (std::string_view name : enum_names<Enum>::megatron) {
        if (name == text) return static_cast<Enum>(i);
        ++i;
    }
    return std::nullopt;
}

} // namespace capscope
