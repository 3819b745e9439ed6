#pragma once
//! @file
//! Whether a `config<Options...>` is spelled so that it means one thing, before any rule reads it
//! (rules K1-K3, "capscope config rule Kn: ... -- fix: ..."):
//! - K1: a kind of option named twice: two impls in `config<...>`, two `layers<N>` in `model<...>`,
//!   two `offload_fraction<F>` in `offload<...>`, two `max_seq_length<N>` in `vision<...>`. The
//!   last would win silently, and could switch a rule off. Module lists may repeat: they add up.
//! - K2: a real value that is no number: `fraction{n, 0}`, or an argument that is not a number.
//! - K3: a `config<...>` argument that is not an option.
//! `config<...>` reports the first with one error, and reads no value of a config spelled wrong;
//! `is_valid_config` is false for it, without a diagnostic.

#include <capscope/config/engine_options.hpp>
#include <capscope/config/model_options.hpp>
#include <capscope/config/offload_options.hpp>
#include <capscope/config/option.hpp>
#include <capscope/config/vision_options.hpp>
#include <capscope/rules/rule.hpp>

#include <boost/hana/length.hpp>
#include <boost/hana/set.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <array>
#include <string_view>
#include <type_traits>

namespace capscope::detail {

enum class spelling { right, not_an_option, option_twice, fact_twice, offload_setting_twice, vision_part_twice, not_a_number };

//! Whether no two of `kinds` are the same (an empty kind may repeat).
template <std::size_t N>
constexpr bool kinds_distinct([[maybe_unused]] const std::array<std::string_view, N>& kinds) {
    if constexpr (N < 2) { // and no loop over nothing: nvcc warns of a pointless comparison
        return true;
    } else {
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t j = i + 1; j < N; ++j)
                if (!kinds[i].empty() && kinds[i] == kinds[j]) return false;
        return true;
    }
}

//! Whether no two types share a kind.
template <class... Kinds>
constexpr bool types_distinct() {
    namespace hana = boost::hana;
    constexpr auto kinds = hana::make_tuple(hana::type_c<Kinds>...);
    return hana::length(hana::to_set(kinds)) == hana::length(kinds);
}

//! What a `vision<...>` part sets: an impl or a module list (their option kind), or the length.
template <class Part>
struct vision_part_kind {
    using type = Part; // max_seq_length<N>: one kind, whatever N
};
template <class Part>
    requires requires { typename Part::option_kind; }
struct vision_part_kind<Part> {
    using type = typename Part::option_kind;
};
template <int N>
struct vision_part_kind<max_seq_length<N>> {
    using type = max_seq_length<0>;
};

//! The spelling of one option (what is inside `model<...>`, `offload<...>`, `vision<...>`).
//! Parts of the wrong sort are left to the option's own static_assert.
template <class Option>
struct option_spelling {
    static constexpr spelling value = spelling::right;
};
template <class... Facts>
struct option_spelling<model<Facts...>> {
    static constexpr spelling value = [] {
        if constexpr (!(model_fact<Facts> && ...)) return spelling::right;
        else if constexpr (!(Facts::well_formed && ...)) return spelling::not_a_number;
        else if constexpr (!kinds_distinct(std::array<std::string_view, sizeof...(Facts)>{Facts::fact_kind...})) return spelling::fact_twice;
        else return spelling::right;
    }();
};
template <class... Parts>
struct option_spelling<offload<Parts...>> {
    static constexpr spelling value = [] {
        if constexpr (!(offload_part<Parts> && ...)) return spelling::right;
        else if constexpr (!(Parts::well_formed && ...)) return spelling::not_a_number;
        else if constexpr (!kinds_distinct(std::array<std::string_view, sizeof...(Parts)>{Parts::part_kind...})) return spelling::offload_setting_twice;
        else return spelling::right;
    }();
};
template <class... Parts>
struct option_spelling<vision<Parts...>> {
    static constexpr spelling value = [] {
        if constexpr (!(vision_part<Parts> && ...)) return spelling::right;
        else if constexpr (!types_distinct<typename vision_part_kind<Parts>::type...>()) return spelling::vision_part_twice;
        else return spelling::right;
    }();
};

//! The first thing wrong with how `config<Options...>` is spelled, or `spelling::right`.
template <class... Options>
constexpr spelling config_spelling() {
    if constexpr (!((config_option<Options> || engine_option<Options>) && ...)) return spelling::not_an_option;
    else if constexpr (!types_distinct<typename Options::option_kind...>()) return spelling::option_twice;
    else {
        spelling s = spelling::right;
        ((s = s == spelling::right ? option_spelling<Options>::value : s), ...);
        return s;
    }
}

//! The rule id of a spelling problem ("" when right).
constexpr std::string_view spelling_rule(spelling s) {
    switch (s) {
    case spelling::right: return "";
    case spelling::not_an_option: return "K3";
    case spelling::not_a_number: return "K2";
    default: return "K1";
    }
}

//! Instantiating it fails one static_assert that names the rule (a base of `config`, as the
//! rule table's report is: one error under clang too).
template <spelling S, class Config>
struct report_spelling {};
template <class Config>
struct report_spelling<spelling::option_twice, Config> {
    static_assert(always_false<Config>, "capscope config rule K1: config<...> names the same kind of option twice (two impls, two "
                                        "modules<...> lists, ...), and only one can hold -- fix: merge them into one");
};
template <class Config>
struct report_spelling<spelling::fact_twice, Config> {
    static_assert(always_false<Config>, "capscope config rule K1: model<...> names the same fact twice (two layers<N>, two "
                                        "capacity_factor<F>, moe_every and moe_pattern, ...), and the last would win silently -- fix: "
                                        "name each fact once");
};
template <class Config>
struct report_spelling<spelling::offload_setting_twice, Config> {
    static_assert(always_false<Config>, "capscope config rule K1: offload<...> names the same setting twice (two offload_fraction<F>, "
                                        "two max_inflight_offloads<N>, ...), and the last would win silently -- fix: name each setting "
                                        "once (module and tensor lists may repeat: they add up)");
};
template <class Config>
struct report_spelling<spelling::vision_part_twice, Config> {
    static_assert(always_false<Config>, "capscope config rule K1: vision<...> names the same part twice (two impls, two modules<...> "
                                        "lists, two max_seq_length<N>), and the last would win silently -- fix: name each part once");
};
template <class Config>
struct report_spelling<spelling::not_a_number, Config> {
    static_assert(always_false<Config>, "capscope config rule K2: a real-valued option (a dropout, capacity_factor, input_jitter, "
                                        "offload_fraction) is given no number: fraction{n, 0}, or an argument that is not a number -- "
                                        "fix: write the value (g++) or fraction{n, d} with d != 0 (fraction{1, 4} is 0.25)");
};
template <class Config>
struct report_spelling<spelling::not_an_option, Config> {
    static_assert(always_false<Config>, "capscope config rule K3: config<...> is given an argument that is no option -- fix: pass "
                                        "options only (impl::..., modules<...>, model<...>, offload<...>, ...; hook and sharding "
                                        "policies go to composition<Config>)");
};

} // namespace capscope::detail
