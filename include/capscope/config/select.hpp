#pragma once
//! @file
//! From run time back to types: `select<CfgA, CfgB, …>(runtime_config, f)` validates the
//! run-time configuration, finds the compile-time config that normalizes to the same value and
//! calls `f(Cfg{})`, so a trainer picks its configuration by flags yet runs only code checked
//! by the compiler.
//!
//! A candidate matches when every setting is equal, or, written `fixing<Cfg, "impl", "modules">`,
//! when the settings it names are (the keys `capscope-check --verbose` prints): the others pass
//! through, so a command line with `--num-layers 6` still selects a candidate that does not spell
//! the layer count.

#include <capscope/config/config.hpp>
#include <capscope/describe.hpp>
#include <capscope/validate.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace capscope {

//! The run-time configuration breaks rules; `report` says which.
class invalid_configuration : public std::runtime_error {
public:
    explicit invalid_configuration(validation_report r) : std::runtime_error(summary(r)), report(std::move(r)) {}
    validation_report report;

private:
    static std::string summary(const validation_report& r) {
        std::string s = "capscope: the run-time configuration is invalid:";
        for (const finding& v : r.violations)
            s += "\n  [" + std::string(v.rule->id) + "] " + v.text() + "\n      fix: " + std::string(v.rule->fix);
        return s;
    }
};

//! The run-time configuration is valid but none of the compile-time candidates equals it.
class no_matching_config : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

//! A candidate that fixes only the named settings (keys of `describe`); the rest pass through.
//! `f` is called with `Config{}`.
template <class Config, detail::fixed_string... Keys>
struct fixing {
    static_assert(sizeof...(Keys) > 0, "capscope::fixing<Config, \"key\"...>: name at least one setting it fixes");
    using config = Config;
    static constexpr runtime_config normalized = Config::normalized;
};

namespace detail {
template <class C>
struct candidate_traits {
    using config = C;
    static bool matches(const runtime_config& wanted) { return wanted == C::normalized; }
};
template <class Config, fixed_string... Keys>
struct candidate_traits<fixing<Config, Keys...>> {
    using config = Config;
    static bool matches(const runtime_config& wanted) {
        const auto want = describe(wanted), have = describe(Config::normalized);
        auto same = [&](std::string_view key) {
            for (std::size_t i = 0; i < want.size(); ++i)
                if (want[i].key == key) return want[i] == have[i];
            throw std::invalid_argument("capscope::fixing<...>: no setting is named '" + std::string(key) +
                                        "'; the keys are those capscope-check --verbose prints (impl, modules, num_layers, ...)");
        };
        return (same(Keys.view()) && ...);
    }
};

template <class... Configs>
std::string no_match_message(const runtime_config& wanted) {
    std::string s = "capscope::select: no compile-time config matches the run-time configuration";
    std::size_t best = static_cast<std::size_t>(-1);
    std::string closest;
    int index = 0;
    auto consider = [&](const runtime_config& candidate) {
        auto diff = describe_differences(wanted, candidate);
        if (diff.size() < best) {
            best = diff.size();
            closest = "candidate #" + std::to_string(index) + " (run-time value vs candidate):";
            for (const auto& d : diff) closest += "\n  " + d;
        }
        ++index;
    };
    (consider(Configs::normalized), ...);
    if (sizeof...(Configs) == 0) return s + "; no candidates were given";
    return s + ". Closest is " + closest + "\nAdd a config<...> for this configuration to the select<...> list.";
}
} // namespace detail

template <class... Configs, class F>
auto select(const runtime_config& requested, F&& f)
    -> std::common_type_t<std::invoke_result_t<F&, typename detail::candidate_traits<Configs>::config>...> {
    using result = std::common_type_t<std::invoke_result_t<F&, typename detail::candidate_traits<Configs>::config>...>;
    validation_report report = validate(requested);
    if (!report.valid()) throw invalid_configuration(std::move(report));
    const runtime_config& wanted = report.normalized;

    if constexpr (std::is_void_v<result>) {
        bool called = ((detail::candidate_traits<Configs>::matches(wanted) ? (f(typename detail::candidate_traits<Configs>::config{}), true)
                                                                           : false) ||
                       ...);
        if (!called) throw no_matching_config(detail::no_match_message<Configs...>(wanted));
    } else {
        std::optional<result> out;
        bool called = ((detail::candidate_traits<Configs>::matches(wanted)
                            ? (out.emplace(f(typename detail::candidate_traits<Configs>::config{})), true)
                            : false) ||
                       ...);
        if (!called) throw no_matching_config(detail::no_match_message<Configs...>(wanted));
        return std::move(*out);
    }
}

} // namespace capscope
