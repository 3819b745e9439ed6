#pragma once
//! @file
//! Fine-grained activation offloading: `offload<offload_modules<…>, …>` turns it on.

#include <capscope/config/fraction.hpp>
#include <capscope/config/option.hpp>
#include <capscope/detail/short_text.hpp>

namespace capscope {

namespace detail {
template <class T>
concept offload_part = requires(offload_settings& o) {
    typename T::offload_part_tag;
    T::apply(o);
};
//! `Kind` names what a setting sets: `offload<...>` takes each once (rule K1,
//! capscope/config/spelling.hpp); "" for the module lists, which add up.
template <fixed_string Kind>
struct offload_part_base {
    using offload_part_tag = void;
    static constexpr std::string_view part_kind = Kind.view();
    static constexpr bool well_formed = true;
};
} // namespace detail

template <offload_module... Ms>
struct offload_modules : detail::offload_part_base<""> {
    static constexpr void apply(offload_settings& o) { (o.modules.insert(Ms), ...); }
};
//! An offload module by Megatron spelling; unknown names are reported by rule O2.
template <detail::fixed_string Name>
struct offload_module_named : detail::offload_part_base<""> {
    static constexpr void apply(offload_settings& o) {
        if (auto m = parse_megatron_name<offload_module>(Name.view())) o.modules.insert(*m);
        else if (o.unknown_module.empty()) o.unknown_module = detail::unknown_name(Name.view());
    }
};
//! A trainer's own offload names (`offload_tensors<"mixer_in">`): the tensors its stages save
//! under those names. Megatron's offload rules pass over them (capscope/rules/offload.hpp).
template <detail::fixed_string... Names>
struct offload_tensors : detail::offload_part_base<""> {
    static_assert(sizeof...(Names) > 0, "capscope::offload_tensors<...> names at least one tensor name");
    static constexpr void apply(offload_settings& o) { (o.modules.insert(Names.view()), ...); }
};
template <auto F> struct offload_fraction : detail::offload_part_base<"offload_fraction"> {
    static constexpr bool well_formed = detail::real_value_ok<F>(); // F: 0.5, or fraction{1, 2}
    static constexpr void apply(offload_settings& o) { o.fraction = detail::real_value<F>(); }
};
template <long long N> struct min_offloaded_tensor_size : detail::offload_part_base<"min_offloaded_tensor_size"> {
    static constexpr void apply(offload_settings& o) { o.min_tensor_size = N; }
};
template <long long N> struct delta_offload_bytes_across_pp_ranks : detail::offload_part_base<"delta_offload_bytes_across_pp_ranks"> {
    static constexpr void apply(offload_settings& o) { o.delta_bytes_across_pp_ranks = N; }
};
template <int N> struct max_inflight_offloads : detail::offload_part_base<"max_inflight_offloads"> {
    static constexpr void apply(offload_settings& o) { o.max_inflight = N; }
};
struct delay_offload_until_cuda_graph : detail::offload_part_base<"delay_offload_until_cuda_graph"> {
    static constexpr void apply(offload_settings& o) { o.delay_until_cuda_graph = true; }
};

template <class... Parts>
struct offload {
    static_assert((detail::offload_part<Parts> && ...),
                  "capscope::offload<...> takes offload_modules<...>, offload_module_named<\"...\">, offload_tensors<\"...\">, offload_fraction<F>, "
                  "min_offloaded_tensor_size<N>, delta_offload_bytes_across_pp_ranks<N>, max_inflight_offloads<N>, "
                  "delay_offload_until_cuda_graph");
    using option_kind = option_kind::offload;
    static constexpr void apply(runtime_config& c) {
        c.offload.enabled = true;
        (Parts::apply(c.offload), ...);
    }
};

} // namespace capscope
