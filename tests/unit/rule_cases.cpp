#include "rule_cases.hpp"

namespace capscope::test {

namespace {
using G = graph_impl;
using M = capture_module;
using O = offload_module;
constexpr auto local = G::lazy_per_layer;
constexpr auto te = G::ahead_of_time_per_layer;
constexpr auto whole = G::whole_iteration;

void moe8(runtime_config& c) { c.num_experts = 8; }
void drop_pad(runtime_config& c) { moe8(c); c.expert_capacity_factor = 1.0; c.pad_expert_input_to_capacity = true; }
void offload(runtime_config& c, offload_module_set s) { c.offload.enabled = true; c.offload.modules = s; }
void full_iteration_ok(runtime_config& c) { c.impl = whole; c.check_for_nan_in_loss_and_grad = false; }
} // namespace

std::vector<rule_case> all_rule_cases() {
    std::vector<rule_case> v;
    auto add = [&](std::string_view id, auto holds, auto breaks) { v.push_back({id, make(holds), make(breaks)}); };

    // normalization
    add("N1", [](auto& c) { c.enable_cuda_graph = true; }, [](auto& c) { c.enable_cuda_graph = true; c.impl = local; });
    add("N2", [](auto& c) { c.external_cuda_graph = true; }, [](auto& c) { c.enable_cuda_graph = c.external_cuda_graph = true; });
    add("N3", [](auto& c) { c.impl = local; }, [](auto& c) { c.enable_cuda_graph = true; });
    add("N3b", [](auto& c) { c.impl = te; }, [](auto& c) { c.external_cuda_graph = true; });
    add("N4", [](auto& c) { c.deprecated_scope = mods({M::attention}); },
        [](auto& c) { c.deprecated_scope = mods({M::attention}); c.modules = mods({M::mlp}); });
    add("N4b", [](auto& c) { c.modules = mods({M::attention}); }, [](auto& c) { c.deprecated_scope = mods({M::attention}); });
    add("N5", [](auto& c) { c.modules.full = true; c.modules.entries = 1; },
        [](auto& c) { c.modules = mods({M::attention}); c.modules.full = true; c.modules.entries = 2; });
    add("N5b", [](auto& c) { c.modules = mods({M::mlp}); }, [](auto& c) { c.modules.full = true; c.modules.entries = 1; });
    add("N6", [](auto& c) { c.modules = mods({M::attention}); },
        [](auto& c) { c.modules.unknown_name = detail::short_text("atn"); c.modules.entries = 1; });
    add("N7", [](auto& c) { c.modules.full_iteration = true; c.modules.entries = 1; c.check_for_nan_in_loss_and_grad = false; },
        [](auto& c) { c.modules.full_iteration = c.modules.full_iteration_inference = true; c.modules.entries = 2; });
    add("N8a", [](auto& c) { c.impl = local; c.modules.full_iteration = true; c.modules.entries = 1; },
        [](auto& c) { c.impl = te; c.modules.full_iteration = true; c.modules.entries = 1; });
    add("N8b", [](auto& c) { c.modules.full_iteration = true; c.modules.entries = 1; c.inference = inference_scope::eager; },
        [](auto& c) { c.impl = local; c.modules.full_iteration = true; c.modules.entries = 1; c.inference = inference_scope::per_layer; });
    add("N8c", [](auto& c) { full_iteration_ok(c); }, [](auto& c) { c.modules.full_iteration = true; c.modules.entries = 1; });
    add("N8d", [](auto& c) { c.impl = local; c.modules.full_iteration_inference = true; c.modules.entries = 1; },
        [](auto& c) { c.impl = te; c.modules.full_iteration_inference = true; c.modules.entries = 1; });
    add("N8e", [](auto& c) { c.impl = local; c.modules.full_iteration_inference = true; c.modules.entries = 1; c.inference = inference_scope::per_block; },
        [](auto& c) { c.impl = local; c.modules.full_iteration_inference = true; c.modules.entries = 1; c.inference = inference_scope::per_layer; });
    add("N8f", [](auto& c) { c.impl = local; c.inference = inference_scope::per_block; },
        [](auto& c) { c.impl = local; c.modules.full_iteration_inference = true; c.modules.entries = 1; });
    add("N8g", [](auto&) {}, [](auto& c) { c.modules.full_iteration_inference = true; c.modules.entries = 1; });
    add("N9", [](auto& c) { c.impl = local; }, [](auto& c) { c.unknown_impl = detail::short_text("lokal"); });
    add("N10", [](auto& c) { c.impl = local; c.inference = inference_scope::per_block; }, [](auto& c) { c.impl = local; });
    add("N11", [](auto& c) { c.impl = local; c.inference = inference_scope::per_block; },
        [](auto& c) { c.impl = te; c.inference = inference_scope::per_layer; });
    add("N12", [](auto& c) { full_iteration_ok(c); }, [](auto& c) { full_iteration_ok(c); c.modules = mods({M::attention}); });

    // capture scope
    add("S0", [](auto& c) { c.impl = whole; c.check_for_nan_in_loss_and_grad = false; c.cpu_offloading_num_layers = 2; },
        [](auto& c) { c.impl = local; c.cpu_offloading_num_layers = 2; });
    add("S1", [](auto& c) { c.impl = local; moe8(c); c.modules = mods({M::moe_router, M::moe_preprocess}); },
        [](auto& c) { c.impl = local; moe8(c); c.modules = mods({M::moe_router}); });
    add("S2", [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router}); },
        [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe, M::moe_router}); });
    add("S3", [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router, M::moe_preprocess}); },
        [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_preprocess}); });
    add("S4", [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router}); },
        [](auto& c) { c.impl = te; c.num_experts = 1; c.modules = mods({M::moe_router}); });
    add("S5", [](auto& c) { c.impl = te; moe8(c); c.moe_layers = moe_layer_layout::every(2); c.modules = mods({M::mlp}); },
        [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::mlp}); });
    add("S6", [](auto& c) { c.impl = te; drop_pad(c); c.modules = mods({M::moe}); },
        [](auto& c) { c.impl = te; moe8(c); c.expert_capacity_factor = 1.0; c.modules = mods({M::moe}); });
    add("S7", [](auto& c) { c.impl = te; moe8(c); c.dispatcher = token_dispatcher::alltoall; c.modules = mods({M::moe_router, M::moe_preprocess}); },
        [](auto& c) { c.impl = te; moe8(c); c.dispatcher = token_dispatcher::alltoall; c.router_padding_for_fp8 = true;
                      c.modules = mods({M::moe_router, M::moe_preprocess}); });

    // recompute
    add("R0", [](auto& c) { c.recompute = recompute_granularity::selective; c.recompute_modules = recompute_module_set{recompute_module::mlp}; },
        [](auto& c) { c.recompute = recompute_granularity::selective; c.unknown_recompute_module = capscope::detail::short_text("attention"); });
    add("R1", [](auto& c) { full_iteration_ok(c); c.recompute = recompute_granularity::full; },
        [](auto& c) { c.impl = te; c.recompute = recompute_granularity::full; });
    add("R2", [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router}); c.recompute = recompute_granularity::selective;
                            c.recompute_modules = recompute_module_set{recompute_module::moe_act}; },
        [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router}); c.recompute = recompute_granularity::selective;
                      c.recompute_modules = recompute_module_set{recompute_module::moe}; });
    add("R3", [](auto& c) { c.impl = local; c.recompute = recompute_granularity::selective; c.attention_dropout = 0.0; },
        [](auto& c) { c.impl = local; c.recompute = recompute_granularity::selective; });
    add("R4", [](auto& c) { c.impl = local; c.recompute = recompute_granularity::selective; c.hidden_dropout = 0.0;
                            c.recompute_modules = recompute_module_set{recompute_module::mlp}; },
        [](auto& c) { c.impl = local; c.recompute = recompute_granularity::selective;
                      c.recompute_modules = recompute_module_set{recompute_module::mlp}; });
    add("R5", [](auto& c) { c.impl = local; moe8(c); c.recompute = recompute_granularity::selective;
                            c.recompute_modules = recompute_module_set{recompute_module::moe}; },
        [](auto& c) { c.impl = local; moe8(c); c.input_jitter_eps = 0.01; c.recompute = recompute_granularity::selective;
                      c.recompute_modules = recompute_module_set{recompute_module::moe}; });

    // offloading
    add("O10", [](auto& c) { offload(c, {O::core_attn}); },
        [](auto& c) { offload(c, {O::core_attn}); c.transformer = transformer_impl::local; });
    add("O1", [](auto& c) { offload(c, {O::core_attn}); }, [](auto& c) { offload(c, {O::core_attn}); c.cpu_offloading_num_layers = 1; });
    add("O2", [](auto& c) { offload(c, {O::core_attn}); }, [](auto& c) { offload(c, {}); });
    add("O3", [](auto& c) { offload(c, {O::core_attn, O::attn_proj}); }, [](auto& c) { offload(c, {O::attn_proj}); });
    add("O5", [](auto& c) { offload(c, {O::moe_act}); c.recompute = recompute_granularity::selective; },
        [](auto& c) { offload(c, {O::moe_act}); c.recompute = recompute_granularity::selective;
                      c.recompute_modules = recompute_module_set{recompute_module::moe}; });
    add("O6", [](auto& c) { offload(c, {O::core_attn}); c.offload.fraction = 0.5; },
        [](auto& c) { offload(c, {O::core_attn}); c.offload.min_tensor_size = -1; });
    add("O7", [](auto& c) { offload(c, {O::fused_group_mlp}); c.te_op_fuser = true; },
        [](auto& c) { offload(c, {O::fused_group_mlp, O::moe_act}); c.te_op_fuser = true; });
    add("OC1", [](auto& c) { c.impl = local; c.modules = mods({M::attention}); offload(c, {O::expert_fc1}); },
        [](auto& c) { c.impl = local; c.modules = mods({M::attention}); offload(c, {O::core_attn}); });
    add("OC2", [](auto& c) { c.impl = local; c.modules = mods({M::attention}); offload(c, {O::moe_act}); },
        [](auto& c) { c.impl = local; offload(c, {O::moe_act}); });
    add("OC3", [](auto& c) { c.impl = te; c.modules = mods({M::attention}); offload(c, {O::core_attn}); },
        [](auto& c) { c.impl = local; drop_pad(c); c.modules = mods({M::moe}); offload(c, {O::expert_fc1}); });
    add("OC4", [](auto& c) { c.impl = te; c.modules = mods({M::attention}); offload(c, {O::core_attn}); },
        [](auto& c) { c.impl = te; drop_pad(c); c.modules = mods({M::moe}); offload(c, {O::core_attn}); });
    add("OC5", [](auto& c) { c.impl = te; c.modules = mods({M::attention}); offload(c, {O::core_attn}); c.warmup_steps = 1; },
        [](auto& c) { c.impl = te; c.modules = mods({M::attention}); offload(c, {O::core_attn}); c.warmup_steps = 0; });
    add("OC6", [](auto& c) { full_iteration_ok(c); offload(c, {O::core_attn}); c.offload.max_inflight = 0; },
        [](auto& c) { full_iteration_ok(c); offload(c, {O::core_attn}); c.offload.max_inflight = -1; });
    add("OB1", [](auto& c) { c.impl = te; c.modules = mods({M::mlp}); offload(c, {O::attn_norm}); },
        [](auto& c) { c.impl = te; c.modules = mods({M::attention}); offload(c, {O::attn_norm, O::core_attn}); });
    add("OB2", [](auto& c) { c.impl = te; c.modules = mods({M::attention, M::mlp}); offload(c, {O::mlp_norm}); },
        [](auto& c) { c.impl = te; moe8(c); c.modules = mods({M::moe_router}); offload(c, {O::mlp_norm}); });

    // training loop and FSDP
    add("E1", [](auto& c) { c.impl = te; c.modules = mods({M::attention}); c.overlap_moe_expert_parallel_comm = true; },
        [](auto& c) { c.impl = te; c.modules = mods({M::mlp}); c.overlap_moe_expert_parallel_comm = true; });
    add("A1", [](auto& c) { full_iteration_ok(c); }, [](auto& c) { c.impl = whole; });
    add("A2", [](auto& c) { c.impl = local; c.inference = inference_scope::per_block; c.fp8 = fp8_format::hybrid;
                            c.fp8_scaling = fp8_recipe::mxfp8; c.transformer = transformer_impl::inference_optimized; },
        [](auto& c) { c.impl = local; c.inference = inference_scope::per_block; c.fp8 = fp8_format::e4m3; });
    add("A3", [](auto& c) { c.impl = local; c.inference_dynamic_batching_num_cuda_graphs = -1; },
        [](auto& c) { c.impl = local; c.inference_dynamic_batching_num_cuda_graphs = -2; });
    add("A6", [](auto& c) { c.inference_batch_times_seqlen_threshold = 64; },
        [](auto& c) { c.impl = local; c.inference_batch_times_seqlen_threshold = 64; });
    add("F4", [](auto& c) { c.fsdp.mode = fsdp_mode::v1; c.fsdp.double_buffer = true; },
        [](auto& c) { c.fsdp.mode = fsdp_mode::v1; c.fsdp.max_pool_double_buffer = true; });
    add("X10", [](auto& c) { full_iteration_ok(c); c.fsdp.mode = fsdp_mode::v1; c.overlap_moe_expert_parallel_comm = true; },
        [](auto& c) { c.fsdp.mode = fsdp_mode::v1; c.overlap_moe_expert_parallel_comm = true; c.fsdp.double_buffer = true; });
    add("X11", [](auto& c) { c.fsdp.mode = fsdp_mode::v2; },
        [](auto& c) { c.fsdp.mode = fsdp_mode::v2; c.fsdp.persistent_buffer_on_alloc_fail = true; });
    add("F1", [](auto& c) { c.impl = te; c.fsdp = {fsdp_mode::v1, true, true}; },
        [](auto& c) { c.impl = te; c.fsdp = {fsdp_mode::v1, false, true}; });
    add("F2", [](auto& c) { c.impl = te; c.fsdp = {fsdp_mode::v1, true, true}; },
        [](auto& c) { c.impl = te; c.fsdp = {fsdp_mode::v1, true, false}; });

    // vision encoder
    add("V1", [](auto& c) { c.vision.impl = te; }, [](auto& c) { c.vision.impl = local; });
    add("V2", [](auto& c) { c.vision.impl = te; c.vision.modules = {M::attention, M::mlp}; },
        [](auto& c) { c.vision.impl = te; c.vision.unknown_module = detail::short_text("attention"); });
    add("V3", [](auto& c) { c.vision.impl = te; c.vision.max_seq_length = 784; },
        [](auto& c) { c.vision.impl = te; c.vision.max_seq_length = -4; });
    add("V4", [](auto& c) { c.vision.impl = te; c.vision.modules = {M::attention}; c.vision.max_seq_length = 1; },
        [](auto& c) { c.vision.modules = {M::attention}; });
    add("V5", [](auto& c) { c.vision.impl = te; c.vision.max_seq_length = 784; }, [](auto& c) { c.vision.impl = te; });
    return v;
}

} // namespace capscope::test
