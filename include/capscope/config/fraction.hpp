#pragma once
//! @file
//! The value of a real-valued option (a capacity factor, a dropout, a fraction) as a template
//! argument every C++20 compiler takes: `capacity_factor<fraction{5, 4}>` is 1.25. g++ also takes
//! the value itself, `capacity_factor<1.25>`; clang up to 17 takes no floating-point template
//! argument, so code that builds with both compilers writes a `fraction`. A third member scales
//! by a power of two, so every finite double has an exact spelling (`fraction{1, 1, -100}` is
//! 2^-100; `capscope-check --emit-cpp` writes 1e-30 that way).

#include <limits>
#include <type_traits>

namespace capscope {

struct fraction {
    long long numerator = 0;
    long long denominator = 1;
    int binary_exponent = 0; //!< the value is numerator / denominator * 2^binary_exponent
};

namespace detail {
//! Whether `V` is a number: not a `fraction` with denominator 0 (rule K2, capscope/config/spelling.hpp).
template <auto V>
constexpr bool real_value_ok() {
    using T = std::remove_cvref_t<decltype(V)>;
    if constexpr (std::is_same_v<T, fraction>) return V.denominator != 0;
    else return std::is_arithmetic_v<T>;
}

//! The option's value: a `fraction`, or a floating-point or integer argument. A config checks
//! `real_value_ok` first (rule K2) and asks for no value that is not one.
template <auto V>
constexpr double real_value() {
    using T = std::remove_cvref_t<decltype(V)>; // nvcc names a class-type argument as a const reference
    if constexpr (std::is_same_v<T, fraction>) {
        if (V.denominator == 0) return std::numeric_limits<double>::quiet_NaN();
        // Scaled one doubling or halving at a time: exact, for n / 1 (as --emit-cpp writes it).
        double v = double(V.numerator) / double(V.denominator);
        for (int e = V.binary_exponent; e > 0; --e) v *= 2;
        for (int e = V.binary_exponent; e < 0; ++e) v /= 2;
        return v;
    } else if constexpr (std::is_arithmetic_v<T>) {
        return double(V);
    } else {
        return std::numeric_limits<double>::quiet_NaN(); // not a number: rule K2 reports it
    }
}
} // namespace detail

} // namespace capscope
