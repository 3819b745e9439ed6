#pragma once
//! @file
//! Plan rule P11, activation offloading across a graph boundary, found from the stages
//! themselves. An offloaded tensor is written by one stage (its producer: the latest earlier
//! stage of its layer that `makes` it, or the stage that keeps it) and kept for the backward by
//! another (the stage whose `saves` name it). Its copy out is issued from the producer's
//! segment, its copy back is waited for in the keeper's: under a per-layer impl both must be in
//! one graph, or both eager, so a group's copies and the events that order them stay in one
//! place, as Megatron keeps them (spec §4.4, where OB1/OB2 drop the norms whose input crosses a
//! boundary). `layer_plan` reports a breach at compile time, the offload set-up at run time.

#include <capscope/plan/capture_region.hpp>
#include <capscope/plan/plan_error.hpp>
#include <capscope/rules/rule.hpp>
#include <capscope/stage/stage_kind.hpp>

#include <span>
#include <string>

namespace capscope {

//! The stage that writes what stage `keeper` keeps as module input `m`: the latest earlier stage
//! of the keeper's layer that `makes` it (passing over stages outside the layers, such as boundary
//! hooks), or the keeper itself.
constexpr int producer_of(std::span<const stage_facts> stages, int keeper, offload_name m) {
    const int layer = stages[std::size_t(keeper)].layer;
    for (int i = keeper - 1; i >= 0; --i) {
        const stage_facts& s = stages[std::size_t(i)];
        if (s.layer >= 0 && s.layer != layer) break;
        if (s.layer == layer && s.makes.contains(m)) return i;
    }
    return keeper;
}

//! Whether stages `a` and `b` fall in one segment of `stages` under `c`.
constexpr bool same_segment(const capture_scope& c, std::span<const stage_facts> stages, int a, int b) {
    bool same = false;
    split_segments(c, stages, [&](stage_range r) {
        auto in = [&](int i) { return i >= r.first && i < r.first + r.count; };
        if (in(a) && in(b)) same = true;
    });
    return same;
}

struct offload_straddle {
    int producer = -1, keeper = -1;
    offload_name module;
    bool producer_captured = false, keeper_captured = false;
    constexpr bool found() const { return keeper >= 0; }
};

//! The first tensor of `offloaded` whose producer and keeper a graph boundary separates under `c`.
constexpr offload_straddle find_offload_straddle(const capture_scope& c, offload_name_set offloaded, std::span<const stage_facts> stages) {
    if (!is_per_layer(c.impl) || offloaded.empty()) return {};
    for (int k = 0; k < int(stages.size()); ++k) {
        offload_straddle found;
        stages[std::size_t(k)].saves.for_each([&](offload_name m) {
            if (found.found() || !offloaded.contains(m)) return;
            const int p = producer_of(stages, k, m);
            if (p == k) return;
            const bool pc = inside_captured_region(c, stages[std::size_t(p)]), kc = inside_captured_region(c, stages[std::size_t(k)]);
            if ((pc || kc) && !same_segment(c, stages, p, k)) found = {p, k, m, pc, kc};
        });
        if (found.found()) return found;
    }
    return {};
}

namespace detail {
inline std::string placement_words(bool captured) { return captured ? "captured" : "eager"; }
} // namespace detail

//! The run-time form of P11, for a training program's stage list.
inline void check_offload_placement(const capture_scope& c, offload_name_set offloaded, std::span<const stage_facts> facts,
                                    std::span<const stage> stages) {
    const offload_straddle s = find_offload_straddle(c, offloaded, facts);
    if (!s.found()) return;
    const stage& p = stages[std::size_t(s.producer)];
    const stage& k = stages[std::size_t(s.keeper)];
    const std::string m(s.module.view());
    throw plan_error("P11", k.name,
                     "offloaded tensor " + m + " of layer " + std::to_string(k.layer) + " is written by stage '" + p.name + "' (" +
                         detail::placement_words(s.producer_captured) + ") and kept for the backward by stage '" + k.name + "' (" +
                         detail::placement_words(s.keeper_captured) + "): a graph boundary lies between them, so its copies and "
                         "their events would straddle it",
                     "capture both stages or neither (modules {" + detail::module_list(c.regions) + "} under " +
                         std::string(megatron_name(c.impl)) + "), or stop offloading " + m);
}

} // namespace capscope

namespace capscope::detail {
//! An offloaded tensor's name as a template argument, so that the compile-time P11 names it in
//! the note under the error (g++ prints `offload_tensor{"mixer_in"}`; clang++ the characters' codes).
struct offload_tensor {
    char name[48]{};
};
constexpr offload_tensor offload_tensor_of(std::string_view s) {
    offload_tensor t;
    for (std::size_t i = 0; i < s.size() && i + 1 < sizeof t.name; ++i) t.name[i] = s[i];
    return t;
}
} // namespace capscope::detail

namespace capscope::plan_rules {

// Written out (a static_assert message must be a literal): the tensors and stage pairs of
// Megatron's layers by name, and a general form for a trainer's own (named in the note below).

//! P11: an offloaded tensor whose producer and keeper a graph boundary separates.
template <detail::offload_tensor Tensor, auto Producer, auto Keeper, class Schema, class Config>
struct P11 {
    static_assert(detail::always_false<Config>, "capscope plan rule P11: an offloaded tensor is written by one stage and kept for the backward by another, and a graph boundary lies between them (one captured, the other eager, or two graphs), so its copies and their events would straddle it -- fix: capture both stages or neither, or stop offloading the tensor (the tensor, the two stages' kinds and the layer schema are named below: P11<tensor, producer, keeper, schema, config>)");
};
template <class Schema, class Config>
struct P11<detail::offload_tensor_of("mlp_norm"), stage_kind::attention, stage_kind::mlp, Schema, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P11: offloaded tensor mlp_norm (the pre-MLP norm's input) is written by stage attention and kept by stage mlp, and a graph boundary lies between them, so its copies and their events would straddle it -- fix: capture attn and mlp together (or neither), or drop mlp_norm from offload_modules");
};
template <class Schema, class Config>
struct P11<detail::offload_tensor_of("mlp_norm"), stage_kind::attention, stage_kind::moe_router, Schema, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P11: offloaded tensor mlp_norm (the pre-MLP norm's input) is written by stage attention and kept by stage moe_router, and a graph boundary lies between them, so its copies and their events would straddle it -- fix: capture attn and moe_router together (or neither), or drop mlp_norm from offload_modules");
};
template <class Schema, class Config>
struct P11<detail::offload_tensor_of("expert_fc1"), stage_kind::moe_preprocess, stage_kind::moe_experts, Schema, Config> {
    static_assert(detail::always_false<Config>, "capscope plan rule P11: offloaded tensor expert_fc1 (the experts' first linear input) is written by stage moe_preprocess and kept by stage moe_experts, and a graph boundary lies between them, so its copies and their events would straddle it -- fix: under transformer_engine, capture moe_router without moe_preprocess (local captures both, rule S1); or drop expert_fc1 from offload_modules");
};

} // namespace capscope::plan_rules

namespace capscope::detail {

template <class Config, class Schema, int Producer, int Keeper, offload_tensor Tensor>
struct report_offload_straddle {}; // nothing straddles
template <class Config, class Schema, int Producer, int Keeper, offload_tensor Tensor>
    requires(Keeper >= 0)
struct report_offload_straddle<Config, Schema, Producer, Keeper, Tensor>
    : plan_rules::P11<Tensor, Schema::template stage_at<std::size_t(Producer)>::kind,
                      Schema::template stage_at<std::size_t(Keeper)>::kind, Schema, Config> {}; // a base: one error under clang

} // namespace capscope::detail
