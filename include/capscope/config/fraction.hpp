#pragma once
//! @file
//! The value of a real-valued option (a capacity factor, a dropout, a fraction) as a template
//! argument every C++20 compiler takes: `capacity_factor<fraction{5, 4}>` is 1.25. g++ also takes
//! the value itself, `capacity_factor<1.25>`; clang up to 17 takes no floating-point template
//! argument, so code that builds with both compilers writes a `fraction`.

#include <type_traits>

namespace capscope {

struct fraction {
    long long numerator = 0;
    long long denominator = 1;
};

namespace detail {
//! The option's value: a `fraction`, or a floating-point or integer argument.
template <auto V>
constexpr double real_value() {
    using T = std::remove_cvref_t<decltype(V)>; // nvcc names a class-type argument as a const reference
    if constexpr (std::is_same_v<T, fraction>) {
        static_assert(V.denominator != 0, "capscope::fraction{n, d}: the denominator d is not 0");
        return double(V.numerator) / double(V.denominator);
    } else {
        static_assert(std::is_arithmetic_v<T>, "capscope: a real-valued option takes a number (g++) or capscope::fraction{n, d} (any compiler)");
        return double(V);
    }
}
} // namespace detail

} // namespace capscope
