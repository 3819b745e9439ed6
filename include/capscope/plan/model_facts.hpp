#pragma once
//! @file
//! Rule P10: the model facts a configuration states (`model<layers<N>, moe_pattern<...>>`) are
//! the facts its Megatron rules were checked against, so they must be the program's: the same
//! number of layers, and MoE stages in exactly the layers the MoE layout names. Checked when a
//! runner is built, before any capture.

#include <capscope/plan/plan_error.hpp>
#include <capscope/stage/stage.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <span>
#include <string>
#include <vector>

namespace capscope {

namespace detail {
inline bool is_moe_stage(const stage& s) {
    return s.kind == stage_kind::moe_router || s.kind == stage_kind::moe_preprocess || s.kind == stage_kind::moe_experts;
}
inline std::string layer_count(int n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); }
} // namespace detail

//! Throws `plan_error` P10 when the stated model facts contradict the stage list of a microbatch.
inline void check_model_facts(const runtime_config& c, std::span<const stage> stages) {
    int layers = 0;
    for (const stage& s : stages) layers = std::max(layers, s.layer + 1);
    if (c.num_layers && *c.num_layers != layers)
        throw plan_error("P10", "",
                         "the config states " + detail::layer_count(*c.num_layers) + " (layers<" + std::to_string(*c.num_layers) +
                             ">), and its rules were checked for them, but the program has " + detail::layer_count(layers),
                         "make layers<N> the model's layer count, or leave it out");
    if (!c.is_moe()) return;
    std::vector<char> has_moe(std::size_t(layers), 0);
    for (const stage& s : stages)
        if (s.layer >= 0 && detail::is_moe_stage(s)) has_moe[std::size_t(s.layer)] = 1;
    const moe_layer_layout& l = c.moe_layers;
    if (l.is_pattern() && l.pattern_length() != layers)
        throw plan_error("P10", "",
                         "the config's moe_pattern<...> lists " + detail::layer_count(l.pattern_length()) + ", but the program has " +
                             detail::layer_count(layers),
                         "give moe_pattern<...> one entry per layer of the model");
    for (int i = 0; i < layers; ++i) {
        const bool stated = l.is_pattern() ? l.pattern_moe(i) : (l.frequency() > 0 && i % l.frequency() == 0);
        if (stated == bool(has_moe[std::size_t(i)])) continue;
        throw plan_error("P10", "",
                         "layer " + std::to_string(i) + (stated ? " is an MoE layer in the config's MoE layout, but the program's has no MoE stage"
                                                                : " of the program has MoE stages, but the config's MoE layout makes it dense"),
                         "make moe_pattern<...> (or moe_every<N>) say which layers of the model are MoE");
    }
}

} // namespace capscope
