#pragma once
//! @file
//! What a stage computes: Megatron's submodules under CUDA graphs
//! (`TransformerLayer._get_submodules_under_cudagraphs`, spec §2.6), plus the model's ends and
//! the step-level work around the microbatches.

#include <capscope/detail/enum_names.hpp>

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

} // namespace capscope
