#pragma once
//! @file
//! What a `config<…>` option is. An option writes itself into a `runtime_config`
//! (`static constexpr void apply(runtime_config&)`) and names its kind (`option_kind`) so a
//! configuration can say each thing at most once.

#include <capscope/vocabulary/runtime_config.hpp>

namespace capscope {

//! Option kinds; a `config<…>` names each at most once.
namespace option_kind {
struct impl; struct modules; struct deprecated_scope; struct enable_cuda_graph; struct external_cuda_graph;
struct inference; struct warmup; struct model; struct recompute; struct recompute_plan; struct training_fact_cpu_offload;
struct nan_check; struct pp_inference; struct dynamic_batching; struct transformer; struct fp8; struct fp8_recipe; struct fsdp; struct offload; struct vision;
struct expert_capacity;
} // namespace option_kind

//! A type usable as a `config<…>` option.
template <class T>
concept config_option = requires(runtime_config& c) {
    typename T::option_kind;
    T::apply(c);
};

} // namespace capscope
