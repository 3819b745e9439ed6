#pragma once
//! @file
//! A flag's entry in the generated table of Megatron's parser.

#include <capscope/flags/megatron_flag_table.hpp>

#include <algorithm>
#include <iterator>
#include <string_view>

namespace capscope::flags::detail {

//! The flag's entry in the generated table (binary search: the table is sorted), or nullptr.
inline const flag_spec* find_flag(std::string_view name) {
    const auto* first = std::begin(megatron_flag_table);
    const auto* last = std::end(megatron_flag_table);
    const auto* it = std::lower_bound(first, last, name, [](const flag_spec& f, std::string_view n) { return f.flag < n; });
    return it != last && it->flag == name ? it : nullptr;
}

} // namespace capscope::flags::detail
