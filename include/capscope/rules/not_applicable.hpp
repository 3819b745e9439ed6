#pragma once
//! @file
//! Spec rules capscope does not enforce, and why. docs/rules.md lists them from here.

#include <string_view>

namespace capscope {

struct not_applicable_rule {
    std::string_view id;
    std::string_view rule;
    std::string_view reason;
};

inline constexpr not_applicable_rule not_applicable_rules[] = {
    {"E2", "delay_wgrad_compute with transformer_engine graphs needs TE >= 2.10", "a Python package version"},
    {"E3", "batch-invariant MoE rejects moe_pad_experts_for_cuda_graph_inference", "an inference-engine mode outside the capture configuration"},
    {"A4", "hybrid_context_parallel rejects enable_cuda_graph", "the legacy flag is migrated before the check, so it never blocks a cuda_graph_impl (spec [INF])"},
    {"A5", "GTP on Blackwell needs CUDA_GRAPHS_USE_NODE_PRIORITY=1", "an environment variable"},
    {"A7", "delay_wgrad_compute + overlap_grad_reduce with wgrad in a graph needs TE >= 2.12", "a Python package version"},
    {"A8", "te_rng_tracker is switched on for graphs", "an automatic fix of an RNG setting, not a capture rule"},
    {"A9", "expandable_segments needs NCCL_GRAPH_REGISTER=0 with TE graphs", "environment variables"},
    {"A10", "RL graph persistence and KV-cache modes", "RL inference engine settings outside the capture configuration"},
    {"A11", "Megatron-FSDP switches on megatron_fsdp_cuda_graph_mode", "an automatic internal mode, no user choice"},
    {"R6", "GTP + local graphs + fp8/fp4 cannot recompute shared_experts", "GTP and fp4 are not modelled yet"},
    {"O4", "gdp_qkv offload rejects gdp_in_proj recompute", "gdp_in_proj is not a modelled recompute module"},
    {"O8", "moe_paged_stash forbids expert offloads", "moe_paged_stash is not modelled"},
    {"O9", "mhc recompute + offloading is not implemented", "mhc is a dev-branch feature"},
    {"O10 (TE part)", "with TE >= 2.10, offloading needs NVTE_CPU_OFFLOAD_V1=1", "an environment variable and a TE version (the transformer_impl half is rule O10)"},
    {"O11", "ncclep flex backend forbids expert_fc1 offload", "the flex backend choice is not modelled"},
    {"X1-X9, X12", "construction-time checks in the capture managers", "they hold by construction in capscope's executors, not as configuration rules"},
};

} // namespace capscope
