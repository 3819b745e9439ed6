#pragma once
//! @file
//! A 64-bit FNV-1a hash: plan fingerprints, and the examples' checksums of results.

#include <cstdint>
#include <string_view>

namespace capscope::detail {

constexpr std::uint64_t fnv1a(std::string_view text, std::uint64_t h = 1469598103934665603ull) {
    for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return h;
}

} // namespace capscope::detail
