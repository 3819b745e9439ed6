#pragma once
//! @file
//! `runtime_config`: one CUDA-graph configuration as a plain value. It holds what was asked
//! for, deprecated inputs included (legacy flags, the `cuda_graph_scope` alias, the
//! `full*` pseudo-modules), so the *same* normalization and rules run on a configuration
//! that came from a compile-time `config<…>` and one that came from Megatron flags.
//! Defaults are Megatron-LM's, so an unset field means what it means to Megatron.
//! It is a literal type: the compiler evaluates the rules on it in constant expressions.

#include <capscope/detail/short_text.hpp>
#include <capscope/vocabulary/capture_module.hpp>
#include <capscope/vocabulary/graph_impl.hpp>
#include <capscope/vocabulary/inference_scope.hpp>
#include <capscope/vocabulary/moe.hpp>
#include <capscope/vocabulary/offload_module.hpp>
#include <capscope/vocabulary/recompute.hpp>
#include <capscope/vocabulary/training.hpp>

#include <optional>
#include <string_view>

namespace capscope {

//! A `cuda_graph_modules` (or deprecated `cuda_graph_scope`) list as written.
struct module_request {
    capture_module_set modules;
    bool full = false;                      //!< deprecated "full" (= whole layer)
    bool full_iteration = false;            //!< deprecated, migrates to impl full_iteration
    bool full_iteration_inference = false;  //!< deprecated, migrates to inference scope block
    bool non_module_entry = false;          //!< a C++ type that is not a capture module
    detail::short_text unknown_name;        //!< first name that is not a module
    int entries = 0;                        //!< entries as written (duplicates counted)

    constexpr bool empty() const { return entries == 0; }
    friend constexpr bool operator==(const module_request&, const module_request&) = default;
};

//! Adds one entry, by Megatron spelling, to a module list: a module, one of the deprecated
//! pseudo-modules, or an unknown name (kept for rule N6). The entry count is the caller's.
constexpr void add_module_name(module_request& r, std::string_view name) {
    if (auto m = parse_megatron_name<capture_module>(name)) r.modules.insert(*m);
    else if (name == "full") r.full = true;
    else if (name == "full_iteration") r.full_iteration = true;
    else if (name == "full_iteration_inference") r.full_iteration_inference = true;
    else if (r.unknown_name.empty()) r.unknown_name = detail::unknown_name(name);
}

//! Fine-grained activation offloading (`--fine-grained-activation-offloading` and friends).
struct offload_settings {
    bool enabled = false;
    offload_module_set modules;
    detail::short_text unknown_module;
    long long min_tensor_size = 1048576;           //!< elements
    double fraction = 1.0;                         //!< of eligible groups
    long long delta_bytes_across_pp_ranks = 0;
    bool delay_until_cuda_graph = false;
    std::optional<int> max_inflight;               //!< per group name; nullopt = unlimited

    friend constexpr bool operator==(const offload_settings&, const offload_settings&) = default;
};

//! Vision-encoder graphs (Megatron-Bridge `vision_cuda_graph_*`); never inherited from the LM.
struct vision_settings {
    graph_impl impl = graph_impl::eager;
    detail::short_text unknown_impl;
    capture_module_set modules;                    //!< empty = whole layer
    detail::short_text unknown_module;
    std::optional<int> max_seq_length;             //!< nullopt/0 = derived by Megatron

    friend constexpr bool operator==(const vision_settings&, const vision_settings&) = default;
};

struct runtime_config {
    // --- capture -------------------------------------------------------------------
    graph_impl impl = graph_impl::eager;           //!< --cuda-graph-impl
    detail::short_text unknown_impl;               //!< an impl name nobody knows (rule N9)
    bool enable_cuda_graph = false;                //!< deprecated --enable-cuda-graph
    bool external_cuda_graph = false;              //!< deprecated --external-cuda-graph
    module_request modules;                        //!< --cuda-graph-modules
    std::optional<module_request> deprecated_scope;//!< deprecated --cuda-graph-scope
    std::optional<inference_scope> inference;      //!< --inference-cuda-graph-scope (unset = derived)
    int warmup_steps = 3;                          //!< --cuda-graph-warmup-steps

    // --- model ---------------------------------------------------------------------
    std::optional<int> num_layers;
    std::optional<int> num_experts;                //!< --num-experts; MoE when > 1
    moe_layer_layout moe_layers;                   //!< --moe-layer-freq
    std::optional<double> expert_capacity_factor;
    bool pad_expert_input_to_capacity = false;
    token_dispatcher dispatcher = token_dispatcher::allgather;
    bool router_padding_for_fp8 = false;
    std::optional<double> input_jitter_eps;
    std::optional<int> shared_expert_intermediate_size;
    bool overlap_moe_expert_parallel_comm = false;
    bool te_op_fuser = false;                      //!< --use-transformer-engine-op-fuser
    double attention_dropout = 0.1;
    double hidden_dropout = 0.1;

    // --- recompute -----------------------------------------------------------------
    std::optional<recompute_granularity> recompute;
    std::optional<recompute_module_set> recompute_modules;  //!< unset = {core_attn}
    detail::short_text unknown_recompute_module;   //!< first --recompute-modules name Megatron does not know (rule R0)
    std::optional<recompute_method> recompute_method_;
    std::optional<int> recompute_num_layers;

    // --- training loop -------------------------------------------------------------
    int cpu_offloading_num_layers = 0;             //!< layer-level CPU offloading when > 0
    bool check_for_nan_in_loss_and_grad = true;
    //! capscope's engine only (no Megatron flag): the check runs on the device, and the optimizer
    //! is a guarded stage that runs only when loss and gradients are finite, so it composes with
    //! a whole-iteration graph (rule A1 does not apply). `nan_check_on_device` sets it.
    bool nan_check_on_device = false;
    //! capscope's engine only (no Megatron flag): the MoE layers are dropless, sized for a static
    //! per-expert capacity, and a step that goes past it is refused on the device and rerun
    //! eagerly (training_program::rerun), so `moe` can be captured (rule S6 does not apply).
    //! `static_expert_capacity` sets it.
    bool static_expert_capacity = false;
    int inference_batch_times_seqlen_threshold = -1;
    int inference_dynamic_batching_num_cuda_graphs = 16;
    transformer_impl transformer = transformer_impl::transformer_engine;
    std::optional<fp8_format> fp8;                 //!< --fp8-format (fp8 training when set)
    fp8_recipe fp8_scaling = fp8_recipe::delayed;  //!< --fp8-recipe
    fsdp_settings fsdp;

    offload_settings offload;
    vision_settings vision;
    //! The config also names regions of the trainer's own (`capture_regions<...>`), so a per-layer
    //! impl captures those regions, not whole layers, though no Megatron module is named. Kept
    //! apart from `modules`, which `modules<...>` and the migrations replace whole.
    bool own_capture_regions = false;

    friend constexpr bool operator==(const runtime_config&, const runtime_config&) = default;

    // --- derived facts the rules read --------------------------------------------
    constexpr bool is_moe() const { return num_experts.has_value() && *num_experts > 1; }
    constexpr bool has_moe_layers() const { return is_moe() && moe_layers.has_moe_layer(); }
    constexpr bool has_dense_layers() const {
        return !is_moe() || moe_layers.has_dense_layer(num_layers.value_or(-1));
    }
    constexpr bool drop_and_pad() const {
        return expert_capacity_factor.has_value() && pad_expert_input_to_capacity;
    }
    constexpr bool cpu_offloading() const { return cpu_offloading_num_layers > 0; }
    constexpr bool captures(capture_module m) const { return modules.modules.contains(m); }
    //! Per-layer impls capture whole layers: no module and no region of the trainer's named.
    constexpr bool captures_whole_layers() const { return modules.modules.empty() && !own_capture_regions; }
    //! Megatron's `full_cudagraph`: the whole iteration, or whole layers.
    constexpr bool full_cudagraph() const {
        return impl == graph_impl::whole_iteration || captures_whole_layers();
    }
    constexpr bool selective_recompute() const { return recompute == recompute_granularity::selective; }
    constexpr recompute_module_set effective_recompute_modules() const {
        return recompute_modules.value_or(recompute_module_set{recompute_module::core_attn});
    }
    constexpr bool recomputes(recompute_module m) const {
        return selective_recompute() && effective_recompute_modules().contains(m);
    }
    constexpr bool offloads(offload_module m) const { return offload.enabled && offload.modules.contains(m); }
};

} // namespace capscope
