#pragma once
//! @file
//! A fixed-capacity string usable in constant expressions. It keeps the text of an
//! unrecognised name (a module or implementation nobody has heard of) inside a
//! `runtime_config`, so that a configuration stays a literal type that can be checked by
//! the compiler and still say *which* name was wrong at run time.

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace capscope::detail {

class short_text {
public:
    static constexpr std::size_t capacity = 47;

    constexpr short_text() = default;
    constexpr explicit short_text(std::string_view s) {
        size_ = std::min(s.size(), capacity);
        for (std::size_t i = 0; i < size_; ++i) data_[i] = s[i];
    }
    constexpr std::string_view view() const { return {data_, size_}; }
    constexpr bool empty() const { return size_ == 0; }

    friend constexpr bool operator==(const short_text& a, const short_text& b) {
        return a.view() == b.view();
    }

private:
    char data_[capacity + 1]{};
    std::size_t size_ = 0;
};

//! A name outside a vocabulary, kept for the message that refuses it. An empty name is kept as
//! "(empty name)", since an empty short_text means "no unknown name": `--cuda-graph-modules ""`
//! names a module that does not exist, and Megatron's TransformerConfig refuses it.
constexpr short_text unknown_name(std::string_view name) { return name.empty() ? short_text("(empty name)") : short_text(name); }

//! A string literal usable as a template argument: `module_named<"attn">`.
template <std::size_t N>
struct fixed_string {
    char data[N]{};
    constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, data); }
    constexpr std::string_view view() const { return {data, N - 1}; }
};

} // namespace capscope::detail
