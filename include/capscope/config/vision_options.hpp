#pragma once
//! @file
//! Vision-encoder graphs: `vision<impl::ahead_of_time_per_layer, modules<…>, max_seq_length<784>>`.

#include <capscope/config/capture_options.hpp>

namespace capscope {

template <int N>
struct max_seq_length {
    static constexpr void apply_vision(vision_settings& v) { v.max_seq_length = N; }
};

namespace detail {
template <class T>
concept vision_part = requires(vision_settings& v) { T::apply_vision(v); } ||
                      requires { typename T::option_kind; T::request; };

template <class T>
constexpr void apply_vision_part(vision_settings& v) {
    if constexpr (requires { T::apply_vision(v); }) {
        T::apply_vision(v);
    } else { // modules<…>
        const module_request& r = T::request;
        v.modules = r.modules;
        if (!r.unknown_name.empty()) v.unknown_module = r.unknown_name;
        else if (r.non_module_entry || r.full || r.full_iteration || r.full_iteration_inference)
            v.unknown_module = short_text("full*/non-module entry");
    }
}
} // namespace detail

template <class... Parts>
struct vision {
    static_assert((detail::vision_part<Parts> && ...),
                  "capscope::vision<...> takes an impl (impl::...), modules<...> and max_seq_length<N>");
    using option_kind = option_kind::vision;
    static constexpr void apply(runtime_config& c) { (detail::apply_vision_part<Parts>(c.vision), ...); }
};

} // namespace capscope
