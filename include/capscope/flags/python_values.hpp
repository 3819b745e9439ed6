#pragma once
//! @file
//! Python's int() and float() on text, as argparse applies them to Megatron's values.

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

namespace capscope::flags::detail {

//! Whether a Python int fits the int capscope keeps it in (beyond it: a usage error, never a wrap).
constexpr bool fits_int(long long x) { return x >= -2147483647LL && x <= 2147483647LL; }

//! Python's int(text): surrounding whitespace, a sign, digits with single underscores between them.
inline std::optional<long long> python_int(std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    bool negative = false;
    if (!v.empty() && (v[0] == '+' || v[0] == '-')) {
        negative = v[0] == '-';
        v.remove_prefix(1);
    }
    std::string digits;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '_' && i > 0 && i + 1 < v.size() && std::isdigit(static_cast<unsigned char>(v[i - 1])) &&
            std::isdigit(static_cast<unsigned char>(v[i + 1])))
            continue;
        if (!std::isdigit(static_cast<unsigned char>(v[i]))) return std::nullopt;
        digits += v[i];
    }
    if (digits.empty()) return std::nullopt;
    long long out = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    if (ec != std::errc{} || p != digits.data() + digits.size()) return std::nullopt;
    return negative ? -out : out;
}

//! Python's float(text): whitespace, a sign, decimal or exponent forms, inf/infinity/nan.
inline std::optional<double> python_float(std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    std::string t;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '_' && i > 0 && i + 1 < v.size() && std::isdigit(static_cast<unsigned char>(v[i - 1])) &&
            std::isdigit(static_cast<unsigned char>(v[i + 1])))
            continue;
        t += static_cast<char>(std::tolower(static_cast<unsigned char>(v[i])));
    }
    std::string_view body = t;
    bool negative = false;
    if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
        negative = body[0] == '-';
        body.remove_prefix(1);
    }
    if (body == "inf" || body == "infinity") return negative ? -HUGE_VAL : HUGE_VAL;
    if (body == "nan") return std::nan("");
    if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) return std::nullopt;
    double out = 0;
    auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), out);
    if (ec != std::errc{} || p != body.data() + body.size()) return std::nullopt;
    return negative ? -out : out;
}

} // namespace capscope::flags::detail
