#pragma once
//! @file
//! The rule table: every rule, in the order Megatron applies them (checked against Megatron
//! itself by the conformance run, docs/conformance.md). Order matters: later rules
//! see the values earlier migrations produced (spec §2.1).

#include <capscope/rules/capture_scope.hpp>
#include <capscope/rules/normalization.hpp>
#include <capscope/rules/offload.hpp>
#include <capscope/rules/recompute.hpp>
#include <capscope/rules/training.hpp>
#include <capscope/rules/vision.hpp>

#include <cstddef>
#include <span>
#include <tuple>

namespace capscope {

template <class... Rules>
struct rule_list {
    static constexpr rule_info table[] = {Rules::info...};
    static constexpr std::size_t size = sizeof...(Rules);
    template <std::size_t I>
    using at = std::tuple_element_t<I, std::tuple<Rules...>>;
};

namespace r = rules;
using all_rules = rule_list<
    // validate_args: normalization (§2.1, §3), then its training-loop checks (§2.4) and the
    // offloading implementation check, in the order validate_args reaches them
    r::N1, r::N2, r::N3, r::N3b, r::N4, r::N4b, r::N5, r::N5b, r::N6, r::N7, r::N8a, r::N8b, r::N8c, r::N8d,
    r::N8e, r::N8f, r::N8g, r::N9, r::N10, r::N11, r::A1, r::A2, r::A3, r::A6, r::O10, r::N12,
    // TransformerConfig.__post_init__: recompute names, general offloading rules (§4.2), then
    // the CUDA-graph block: capture scope and recompute (§2.2), offloading x graphs (§4.3),
    // the boundary norms (§4.4) and expert-parallel overlap (§2.3)
    r::R0, r::O1, r::O2, r::O3, r::O5, r::O6, r::O7,
    r::S0, r::S1, r::S2, r::S3, r::S4, r::S5, r::S6, r::S7,
    r::R1, r::R2, r::R3, r::R4, r::R5,
    r::OC1, r::OC2, r::OC3, r::OC4, r::OC5, r::OC6, r::OB1, r::OB2, r::E1,
    // Megatron-FSDP (§5), checked when the model is wrapped
    r::F4, r::X10, r::X11, r::F1, r::F2,
    // vision encoder (§6)
    r::V1, r::V2, r::V3, r::V4, r::V5>;

//! Every rule, in evaluation order.
inline constexpr std::span<const rule_info> rule_table{all_rules::table};

constexpr const rule_info* find_rule(std::string_view id) {
    for (const rule_info& r : rule_table)
        if (r.id == id) return &r;
    return nullptr;
}

} // namespace capscope
