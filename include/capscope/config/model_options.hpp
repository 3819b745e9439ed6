#pragma once
//! @file
//! The model facts the rules read, grouped in `model<…>`, and recomputation.
//!
//! @code
//! model<layers<24>, experts<8>, moe_every<2>, capacity_factor<1.0>, pad_to_capacity,
//!       dispatcher<token_dispatcher::alltoall>, attention_dropout<0.0>, hidden_dropout<0.0>>
//! @endcode
//! Unstated facts take Megatron's defaults (dense model, dropouts 0.1, allgather dispatcher).

#include <capscope/config/fraction.hpp>
#include <capscope/config/option.hpp>
#include <capscope/detail/short_text.hpp>

#include <string_view>

namespace capscope {

namespace detail {
template <class T>
concept model_fact = requires(runtime_config& c) {
    typename T::model_fact_tag;
    T::apply(c);
};
//! `Kind` names what a fact sets: `model<...>` takes each kind once (rule K1,
//! capscope/config/spelling.hpp). `well_formed`: a real value is a number (rule K2).
template <fixed_string Kind>
struct fact_base {
    using model_fact_tag = void;
    static constexpr std::string_view fact_kind = Kind.view();
    static constexpr bool well_formed = true;
};
} // namespace detail

template <int N> struct layers : detail::fact_base<"layers"> { static constexpr void apply(runtime_config& c) { c.num_layers = N; } };
//! `--num-experts`; the model is MoE when N > 1.
template <int N> struct experts : detail::fact_base<"experts"> { static constexpr void apply(runtime_config& c) { c.num_experts = N; } };
//! `--moe-layer-freq N`: every N-th layer is an MoE layer.
template <int N> struct moe_every : detail::fact_base<"moe_every or moe_pattern"> {
    static constexpr void apply(runtime_config& c) { c.moe_layers = moe_layer_layout::every(N); }
};
//! `--moe-layer-freq "[…]"`: one 0 (dense) or 1 (MoE) per layer.
template <int... Bits> struct moe_pattern : detail::fact_base<"moe_every or moe_pattern"> {
    static_assert(((Bits == 0 || Bits == 1) && ...), "capscope::moe_pattern<...> takes 0 (dense layer) or 1 (MoE layer) per layer");
    static constexpr void apply(runtime_config& c) {
        moe_layer_layout l;
        (l.append(Bits == 1), ...);
        c.moe_layers = l;
    }
};
template <auto F> struct capacity_factor : detail::fact_base<"capacity_factor"> {
    static constexpr bool well_formed = detail::real_value_ok<F>(); // F: 1.25, or fraction{5, 4} (capscope/config/fraction.hpp)
    static constexpr void apply(runtime_config& c) { c.expert_capacity_factor = detail::real_value<F>(); }
};
struct pad_to_capacity : detail::fact_base<"pad_to_capacity"> {
    static constexpr void apply(runtime_config& c) { c.pad_expert_input_to_capacity = true; }
};
template <token_dispatcher D> struct dispatcher : detail::fact_base<"dispatcher"> {
    static constexpr void apply(runtime_config& c) { c.dispatcher = D; }
};
struct router_padding_for_fp8 : detail::fact_base<"router_padding_for_fp8"> {
    static constexpr void apply(runtime_config& c) { c.router_padding_for_fp8 = true; }
};
template <auto Eps> struct input_jitter : detail::fact_base<"input_jitter"> {
    static constexpr bool well_formed = detail::real_value_ok<Eps>();
    static constexpr void apply(runtime_config& c) { c.input_jitter_eps = detail::real_value<Eps>(); }
};
template <int Size> struct shared_experts : detail::fact_base<"shared_experts"> {
    static constexpr void apply(runtime_config& c) { c.shared_expert_intermediate_size = Size; }
};
struct expert_parallel_comm_overlap : detail::fact_base<"expert_parallel_comm_overlap"> {
    static constexpr void apply(runtime_config& c) { c.overlap_moe_expert_parallel_comm = true; }
};
struct te_op_fuser : detail::fact_base<"te_op_fuser"> { static constexpr void apply(runtime_config& c) { c.te_op_fuser = true; } };
template <auto P> struct attention_dropout : detail::fact_base<"attention_dropout"> {
    static constexpr bool well_formed = detail::real_value_ok<P>();
    static constexpr void apply(runtime_config& c) { c.attention_dropout = detail::real_value<P>(); }
};
template <auto P> struct hidden_dropout : detail::fact_base<"hidden_dropout"> {
    static constexpr bool well_formed = detail::real_value_ok<P>();
    static constexpr void apply(runtime_config& c) { c.hidden_dropout = detail::real_value<P>(); }
};

//! The model; see the facts above.
template <class... Facts>
struct model {
    static_assert((detail::model_fact<Facts> && ...),
                  "capscope::model<...> takes model facts only (layers<N>, experts<N>, moe_every<N>, moe_pattern<...>, "
                  "capacity_factor<F>, pad_to_capacity, dispatcher<D>, router_padding_for_fp8, input_jitter<E>, "
                  "shared_experts<N>, expert_parallel_comm_overlap, te_op_fuser, attention_dropout<P>, hidden_dropout<P>)");
    using option_kind = option_kind::model;
    static constexpr void apply(runtime_config& c) { (Facts::apply(c), ...); }
};

//! `--recompute-granularity G [--recompute-modules Ms…]`; no modules = Megatron's default {core_attn}.
template <recompute_granularity G, recompute_module... Ms>
struct recompute {
    using option_kind = option_kind::recompute;
    static constexpr void apply(runtime_config& c) {
        c.recompute = G;
        if constexpr (sizeof...(Ms) > 0) c.recompute_modules = recompute_module_set{Ms...};
    }
};

//! `--recompute-granularity G --recompute-modules Names…` by Megatron spelling, e.g.
//! `recompute_named<recompute_granularity::selective, "core_attn", "mlp">`; a name Megatron does
//! not know is reported by rule R0.
template <recompute_granularity G, detail::fixed_string... Names>
struct recompute_named {
    using option_kind = option_kind::recompute;
    static constexpr void apply(runtime_config& c) {
        c.recompute = G;
        if constexpr (sizeof...(Names) > 0) {
            recompute_module_set s;
            auto add = [&](std::string_view name) {
                if (auto m = parse_megatron_name<recompute_module>(name)) s.insert(*m);
                else if (c.unknown_recompute_module.empty()) c.unknown_recompute_module = detail::unknown_name(name);
            };
            (add(Names.view()), ...);
            c.recompute_modules = s;
        }
    }
};

//! `--recompute-method M [--recompute-num-layers N]` (read by no graph rule; kept so the C++
//! config equals the run-time one). N = -1 leaves the layer count unset.
template <recompute_method M, int N = -1>
struct recompute_plan {
    using option_kind = option_kind::recompute_plan;
    static constexpr void apply(runtime_config& c) {
        c.recompute_method_ = M;
        if (N >= 0) c.recompute_num_layers = N;
    }
};

//! `--recompute-num-layers N` without a method.
template <int N>
struct recompute_layers {
    using option_kind = option_kind::recompute_plan;
    static constexpr void apply(runtime_config& c) { c.recompute_num_layers = N; }
};

} // namespace capscope
