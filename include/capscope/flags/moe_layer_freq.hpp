#pragma once
//! @file
//! Megatron's `--moe-layer-freq`: an integer N, or a Python list expression such as
//! "([0]+[1]*23)" or "[1,1,1,0]*3" (only digits, commas, brackets, parentheses, + and * allowed).
//! Megatron `eval`s the expression; this is a small evaluator for exactly that grammar.

#include <capscope/flags/python_values.hpp>
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
    static constexpr long long max_number = 1'000'000'000'000; // far past any layer count, far from overflow
    static constexpr int max_depth = 256;                       // sum() recurses once a bracket
    int depth_ = 0;

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
            if (v.number > max_number) fail("number too large");
        }
        return v;
    }
    value product() {
        value v = atom();
        while (eat('*')) {
            value r = atom();
            if (v.is_list && r.is_list) fail("cannot multiply two lists");
            if (!v.is_list && !r.is_list) {
                if (r.number != 0 && v.number > max_number / r.number) fail("number too large");
                v.number *= r.number;
                continue;
            }
            const value& list = v.is_list ? v : r;
            long long times = v.is_list ? r.number : v.number;
            // times alone first: times * size could wrap around to a small number.
            if (times < 0 || times > static_cast<long long>(max_items) || static_cast<std::size_t>(times) * list.items.size() > max_items)
                fail("pattern too long");
            value out{true, 0, {}};
            for (long long i = 0; i < times; ++i) out.items.insert(out.items.end(), list.items.begin(), list.items.end());
            v = std::move(out);
        }
        return v;
    }
    value atom() {
        const bool opens = pos_ < s_.size() && (s_[pos_] == '(' || s_[pos_] == '[');
        if (opens && depth_ == max_depth) fail("brackets nested deeper than " + std::to_string(max_depth));
        if (opens) ++depth_;
        value v = opens ? bracketed() : number();
        if (opens) --depth_;
        return v;
    }
    value bracketed() {
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
        fail("expected '(' or '['"); // atom() calls this at one only
    }
    value number() {
        std::size_t start = pos_;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        if (start == pos_) fail(pos_ < s_.size() ? "unexpected '" + std::string(1, s_[pos_]) + "'" : "unexpected end");
        if (pos_ - start > 9) fail("number too large");
        return {false, std::stoll(std::string(s_.substr(start, pos_ - start))), {}};
    }
};
} // namespace detail

//! A `--moe-layer-freq` value as Megatron's parser reads it, and what Megatron refuses only
//! when it builds the layers (gpt_layer_specs.py): a frequency below 1, an empty pattern, entries
//! other than 0 and 1. `layout` is then what Megatron's graph rules see (S5 asks `freq == 1 or 0
//! not in list`): an integer below 1 as a mixed model, nonzero entries as MoE layers.
struct read_moe_layer_freq_result {
    moe_layer_layout layout;
    std::string refused; //!< empty when the value is one the layers can be built from
};

//! Reads a `--moe-layer-freq` value; throws std::invalid_argument where Megatron's parser fails.
inline read_moe_layer_freq_result read_moe_layer_freq(std::string_view text) {
    if (text.find('[') == std::string_view::npos) {
        // Megatron's moe_freq_type: without '[' the value goes to int(), which evaluates nothing.
        const auto n = detail::python_int(text);
        if (!n)
            throw std::invalid_argument("invalid moe_freq_type value: '" + std::string(text) +
                                        "' (without '[' Megatron reads the value with int(); write a number such as 2, "
                                        "or a list pattern such as [1,0]*2)");
        if (*n > (1 << 30)) throw std::invalid_argument("--moe-layer-freq " + std::string(text) + " is too large");
        if (*n < 1)
            return {moe_layer_layout::every(2),  // Megatron's graph rules read any integer but 1 as a mixed model
                    "--moe-layer-freq " + std::to_string(*n) + " is not a positive frequency (Megatron builds layer i as MoE when i % " +
                        std::to_string(*n) + " == 0: " +
                        (*n == 0 ? "a division by zero" : "every layer, by accident of Python's modulo") + ")"};
        return {moe_layer_layout::every(static_cast<int>(*n)), ""};
    }
    for (char c : text)
        if (!(std::isdigit(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']' || c == '(' ||
              c == ')' || c == '+' || c == '*'))
            throw std::invalid_argument("invalid --moe-layer-freq '" + std::string(text) +
                                        "': only digits, commas, [ ] ( ) + * are allowed");
    auto v = detail::list_expression(text).parse();
    if (!v.is_list) throw std::invalid_argument("--moe-layer-freq pattern must evaluate to a list");
    if (v.items.size() > static_cast<std::size_t>(moe_layer_layout::max_pattern_layers))
        throw std::invalid_argument("--moe-layer-freq pattern has more than 256 layers");
    if (v.items.empty()) return {moe_layer_layout::every(1), "Invalid length of moe_layer_pattern: 0 (--moe-layer-freq " + std::string(text) + ")"};
    read_moe_layer_freq_result out;
    for (long long b : v.items) {
        if (b != 0 && b != 1 && out.refused.empty())
            out.refused = "Invalid layer pattern: --moe-layer-freq " + std::string(text) + " has entries other than 0 (dense) and 1 (MoE)";
        out.layout.append(b != 0);
    }
    return out;
}

//! Parses a `--moe-layer-freq` value that layers can be built from; throws std::invalid_argument
//! with a clear message otherwise.
inline moe_layer_layout parse_moe_layer_freq(std::string_view text) {
    read_moe_layer_freq_result r = read_moe_layer_freq(text);
    if (!r.refused.empty()) throw std::invalid_argument(r.refused);
    return r.layout;
}

} // namespace capscope::flags
