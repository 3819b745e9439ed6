#pragma once
//! @file
//! What a stage computes. `stage_kind` lists the predefined kinds: Megatron's submodules under
//! CUDA graphs (`TransformerLayer._get_submodules_under_cudagraphs`, spec §2.6), plus the model's
//! ends and the step-level work around the microbatches. A trainer that is not shaped like
//! Megatron names its own kinds: `stage_kind_id` is a kind by name, made from either.

#include <capscope/detail/enum_names.hpp>
#include <capscope/detail/short_text.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace capscope {

enum class stage_kind : std::uint8_t {
    embedding,      //!< before the layers (outside every per-layer capture region)
    attention,      //!< input norm, self-attention, residual add
    mlp,            //!< pre-MLP norm, dense MLP, residual add
    moe_router,     //!< pre-MLP norm, router logits, top-k gates
    moe_preprocess, //!< token permutation into per-expert buffers
    moe_experts,    //!< expert MLPs, unpermute/combine, residual add
    mamba,          //!< norm, mixer, residual add
    head,           //!< after the layers: final norm, output layer, loss
    optimizer,      //!< once per step, after every microbatch
    other,          //!< anything else (zeroing gradients, a trainer's own work)
};

template <>
struct enum_names<stage_kind> {
    static constexpr std::string_view megatron[] = {"embedding", "attention", "mlp", "moe_router", "moe_preprocess",
                                                    "moe_experts", "mamba", "head", "optimizer", "other"};
    static constexpr std::string_view cpp[] = {"embedding", "attention", "mlp", "moe_router", "moe_preprocess",
                                               "moe_experts", "mamba", "head", "optimizer", "other"};
};

//! A stage's kind by name: a predefined `stage_kind`, or a trainer's own (`stage_kind_id{"mixer"}`,
//! `stage_decl<kind<"mixer">, ...>`). The name is a view: a literal, or a string that outlives it.
struct stage_kind_id {
    std::string_view name = "other";

    constexpr stage_kind_id() = default;
    constexpr stage_kind_id(stage_kind k) : name(enum_names<stage_kind>::cpp[std::size_t(k)]) {} // NOLINT: the predefined kinds
    constexpr explicit stage_kind_id(std::string_view own) : name(own) {}

    friend constexpr bool operator==(const stage_kind_id&, const stage_kind_id&) = default;
};

//! A trainer's own stage kind as a template argument: `stage_decl<kind<"mixer">, ...>`.
template <detail::fixed_string Name>
inline constexpr auto kind = Name;

} // namespace capscope
