#pragma once
//! @file
//! Megatron's `--moe-layer-freq`: an integer N, or a Python list expression such as
//! "([0]+[1]*23)" or "[1,1,1,0]*3" (only digits, commas, brackets, parentheses, + and * allowed).
//! Megatron `eval`s the expression; this is a small evaluator for exactly that grammar.

#include <capscope/vocabulary/moe.hpp>

#include <cctype>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace capscope::flags {

namespace detail {
class list_expression {
public:
    explicit list_expression(std::string_view text) : s_(text) {}

    struct value {
        bool is_list = false;
        long long number = 0;
        std::vector<long long> items;
    };

    value parse() {
        value v = sum();
        if (pos_ != s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
        return v;
    }

private:
    std::string_view s_;
    std::size_t pos_ = 0;
    static constexpr std::size_t max_items = 4096;

    [[noreturn]] void fail(const std::string& why) const {
        throw std::invalid_argument("invalid --moe-layer-freq pattern '" + std::string(s_) + "': " + why);
    }
    bool eat(char c) {
        if (pos_ < s_.size() && s_[pos_] == c) { ++pos_; return true; }
        return false;
    }
    value sum() {
        value v = product();
        while (eat('+')) {
            value r = product();
            if (v.is_list != r.is_list) fail("cannot add a list and a number");
            if (v.is_list) v.items.insert(v.items.end(), r.items.begin(), r.items.end());
            else v.number += r.number;
            if (v.items.size() > max_items) fail("pattern too long");
        }
        return v;
    }
    value product() {
        value v = atom();
        while (eat('*')) {
            value r = atom();
            if (v.is_list && r.is_list) fail("cannot multiply two lists");
            if (!v.is_list && !r.is_list) { v.number *= r.number; continue; }
            const value& list = v.is_list ? v : r;
            long long times = v.is_list ? r.number : v.number;
            if (times < 0 || static_cast<std::size_t>(times) * list.items.size() > max_items) fail("pattern too long");
            value out{true, 0, {}};
            for (long long i = 0; i < times; ++i) out.items.insert(out.items.end(), list.items.begin(), list.items.end());
            v = std::move(out);
        }
        return v;
    }
    value atom() {
        if (eat('(')) {
            value v = sum();
            if (!eat(')')) fail("missing ')'");
            return v;
        }
        if (eat('[')) {
            value v{true, 0, {}};
            if (eat(']')) return v;
            do {
                value item = sum();
                if (item.is_list) fail("nested lists are not layer patterns");
                v.items.push_back(item.number);
            } while (eat(','));
            if (!eat(']')) fail("missing ']'");
            return v;
        }
        std::size_t start = pos_;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        if (start == pos_) fail(pos_ < s_.size() ? "unexpected '" + std::string(1, s_[pos_]) + "'" : "unexpected end");
        if (pos_ - start > 9) fail("number too large");
        return {false, std::stoll(std::string(s_.substr(start, pos_ - start))), {}};
    }
};
} // namespace detail

//! Parses a `--moe-layer-freq` value; throws std::invalid_argument with a clear message.
inline moe_layer_layout parse_moe_layer_freq(std::string_view text) {
    for (char c : text)
        if (!(std::isdigit(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']' || c == '(' ||
              c == ')' || c == '+' || c == '*'))
            throw std::invalid_argument("invalid --moe-layer-freq '" + std::string(text) +
                                        "': only digits, commas, [ ] ( ) + * are allowed");
    auto v = detail::list_expression(text).parse();
    if (text.find('[') == std::string_view::npos) {
        if (v.is_list || v.number < 1) throw std::invalid_argument("--moe-layer-freq must be a positive integer or a list pattern");
        return moe_layer_layout::every(static_cast<int>(v.number));
    }
    if (!v.is_list) throw std::invalid_argument("--moe-layer-freq pattern must evaluate to a list");
    if (v.items.size() > static_cast<std::size_t>(moe_layer_layout::max_pattern_layers))
        throw std::invalid_argument("--moe-layer-freq pattern has more than 256 layers");
    moe_layer_layout l;
    for (long long b : v.items) {
        if (b != 0 && b != 1) throw std::invalid_argument("--moe-layer-freq pattern entries must be 0 (dense) or 1 (MoE)");
        l.append(b == 1);
    }
    return l;
}

} // namespace capscope::flags
