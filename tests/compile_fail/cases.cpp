// Compile-fail cases, one per rule that rejects at compile time.
//
// Compiled as is, every `ok_*` twin must compile (the rule holds). Compiled with
// -DCASE_<ID>[__variant], the broken config must fail, and the first error must read
// "capscope rule <ID>:" (tests/compile_fail/check.py). Each twin differs from its broken
// config in the one thing the rule is about.
// The rule table's rules need the configuration alone (a third of capscope.hpp's compile time).
#include <capscope/config.hpp>

using namespace capscope;
using tr = impl::ahead_of_time_per_layer;
using lo = impl::lazy_per_layer;
using moe8 = model<experts<8>>;

#define CHECK_COMPILES(...) static_assert(sizeof(__VA_ARGS__) > 0)
// A valid twin. check.py compiles the twins once on their own; a broken case is compiled without
// them (CAPSCOPE_ONE_CASE), so each case costs its own instantiation only.
#if defined(CAPSCOPE_ONE_CASE)
#define TWIN(...)
#else
#define TWIN(...) static_assert(sizeof(__VA_ARGS__) > 0)
#endif

// ---- normalization -------------------------------------------------------------------
TWIN(config<deprecated::enable_cuda_graph>);
#ifdef CASE_N1
CHECK_COMPILES(config<deprecated::enable_cuda_graph, impl::lazy_per_layer>);
#endif
TWIN(config<deprecated::external_cuda_graph>);
#ifdef CASE_N2
CHECK_COMPILES(config<deprecated::enable_cuda_graph, deprecated::external_cuda_graph>);
#endif
TWIN(config<lo, deprecated::cuda_graph_scope<capture::attention>>);
#ifdef CASE_N4
CHECK_COMPILES(config<lo, deprecated::cuda_graph_scope<capture::attention>, modules<capture::mlp>>);
#endif
TWIN(config<lo, modules<deprecated::full>>);
#ifdef CASE_N5
CHECK_COMPILES(config<lo, modules<deprecated::full, capture::attention>>);
#endif
TWIN(config<lo, modules<module_named<"attn">>>);
#ifdef CASE_N6
CHECK_COMPILES(config<lo, modules<module_named<"atn">>>);
#endif
#ifdef CASE_N6__non_module_type
CHECK_COMPILES(config<lo, modules<capture::attention, int>>);
#endif
TWIN(config<modules<deprecated::full_iteration>, no_nan_check>);
#ifdef CASE_N7
CHECK_COMPILES(config<modules<deprecated::full_iteration, deprecated::full_iteration_inference>, no_nan_check>);
#endif
#ifdef CASE_N8a
CHECK_COMPILES(config<tr, modules<deprecated::full_iteration>, no_nan_check>);
#endif
#ifdef CASE_N8b
CHECK_COMPILES(config<lo, modules<deprecated::full_iteration>, inference::per_layer, no_nan_check>);
#endif
TWIN(config<lo, modules<deprecated::full_iteration_inference>>);
#ifdef CASE_N8d
CHECK_COMPILES(config<tr, modules<deprecated::full_iteration_inference>>);
#endif
TWIN(config<lo, modules<deprecated::full_iteration_inference>, inference::per_block>);
#ifdef CASE_N8e
CHECK_COMPILES(config<lo, modules<deprecated::full_iteration_inference>, inference::per_layer>);
#endif
TWIN(config<impl_named<"local">>);
#ifdef CASE_N9
CHECK_COMPILES(config<impl_named<"lokal">>);
#endif
TWIN(config<lo, inference::per_block>);
#ifdef CASE_N11
CHECK_COMPILES(config<tr, inference::per_layer>);
#endif
TWIN(config<impl::whole_iteration, no_nan_check>);
#ifdef CASE_N12
CHECK_COMPILES(config<impl::whole_iteration, modules<capture::attention>, no_nan_check>);
#endif

// ---- capture scope ---------------------------------------------------------------------
TWIN(config<lo, layer_cpu_offloading<0>>);
#ifdef CASE_S0
CHECK_COMPILES(config<lo, layer_cpu_offloading<2>>);
#endif
TWIN(config<lo, modules<capture::moe_router, capture::moe_preprocess>, moe8>);
#ifdef CASE_S1
CHECK_COMPILES(config<lo, modules<capture::moe_router>, moe8>);
#endif
TWIN(config<tr, modules<capture::moe_router>, moe8>);
#ifdef CASE_S2
CHECK_COMPILES(config<tr, modules<capture::moe, capture::moe_router>, moe8>);
#endif
TWIN(config<tr, modules<capture::moe_router, capture::moe_preprocess>, moe8>);
#ifdef CASE_S3
CHECK_COMPILES(config<tr, modules<capture::moe_preprocess>, moe8>);
#endif
#ifdef CASE_S4
CHECK_COMPILES(config<tr, modules<capture::moe_router>>);
#endif
TWIN(config<tr, modules<capture::mlp>, model<experts<8>, moe_every<2>>>);
#ifdef CASE_S5
CHECK_COMPILES(config<tr, modules<capture::mlp>, moe8>);
#endif
TWIN(config<tr, modules<capture::moe>, model<experts<8>, capacity_factor<fraction{1, 1}>, pad_to_capacity>>);
// Dropless MoE in capscope's engine: a static capacity per expert, a step past it rerun eagerly.
TWIN(config<tr, modules<capture::moe>, model<experts<8>>, static_expert_capacity>);
#ifdef CASE_S6
CHECK_COMPILES(config<tr, modules<capture::moe>, model<experts<8>, capacity_factor<fraction{1, 1}>>>);
#endif
TWIN(config<tr, modules<capture::moe_router, capture::moe_preprocess>, model<experts<8>, dispatcher<token_dispatcher::alltoall>>>);
#ifdef CASE_S7
CHECK_COMPILES(config<tr, modules<capture::moe_router, capture::moe_preprocess>,
                      model<experts<8>, dispatcher<token_dispatcher::alltoall>, capacity_factor<fraction{1, 1}>>>);
#endif

// ---- recompute ---------------------------------------------------------------------------
TWIN(config<recompute_named<recompute_granularity::selective, "core_attn", "mlp">>);
#ifdef CASE_R0
CHECK_COMPILES(config<recompute_named<recompute_granularity::selective, "core_attn", "attention">>);
#endif
TWIN(config<impl::whole_iteration, recompute<recompute_granularity::full>, no_nan_check>);
#ifdef CASE_R1
CHECK_COMPILES(config<tr, recompute<recompute_granularity::full>>);
#endif
TWIN(config<tr, modules<capture::moe_router>, moe8, recompute<recompute_granularity::selective, recompute_module::moe_act>>);
#ifdef CASE_R2
CHECK_COMPILES(config<tr, modules<capture::moe_router>, moe8, recompute<recompute_granularity::selective, recompute_module::moe>>);
#endif
TWIN(config<lo, model<attention_dropout<fraction{0, 1}>>, recompute<recompute_granularity::selective>>);
#ifdef CASE_R3
CHECK_COMPILES(config<lo, recompute<recompute_granularity::selective>>);
#endif
TWIN(config<lo, model<hidden_dropout<fraction{0, 1}>>, recompute<recompute_granularity::selective, recompute_module::mlp>>);
#ifdef CASE_R4
CHECK_COMPILES(config<lo, recompute<recompute_granularity::selective, recompute_module::mlp>>);
#endif
TWIN(config<lo, model<experts<8>, hidden_dropout<fraction{0, 1}>>, recompute<recompute_granularity::selective, recompute_module::moe>>);
#ifdef CASE_R5
CHECK_COMPILES(config<lo, model<experts<8>, hidden_dropout<fraction{0, 1}>, input_jitter<fraction{1, 100}>>,
                      recompute<recompute_granularity::selective, recompute_module::moe>>);
#endif

// ---- offloading -------------------------------------------------------------------------
using off_core = offload<offload_modules<offload_module::core_attn>>;
TWIN(config<off_core>);
TWIN(config<off_core, transformer<transformer_impl::transformer_engine>>);
#ifdef CASE_O10
CHECK_COMPILES(config<off_core, transformer<transformer_impl::local>>);
#endif
#ifdef CASE_O1
CHECK_COMPILES(config<off_core, layer_cpu_offloading<1>>);
#endif
#ifdef CASE_O2
CHECK_COMPILES(config<offload<>>);
#endif
#ifdef CASE_O2__unknown_name
CHECK_COMPILES(config<offload<offload_module_named<"qkv">>>);
#endif
TWIN(config<offload<offload_modules<offload_module::core_attn, offload_module::attn_proj>>>);
#ifdef CASE_O3
CHECK_COMPILES(config<offload<offload_modules<offload_module::attn_proj>>>);
#endif
TWIN(config<offload<offload_modules<offload_module::moe_act>>, recompute<recompute_granularity::selective>>);
#ifdef CASE_O5
CHECK_COMPILES(config<offload<offload_modules<offload_module::moe_act>>, recompute<recompute_granularity::selective, recompute_module::moe>>);
#endif
TWIN(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<fraction{1, 2}>>>);
#ifdef CASE_O6
CHECK_COMPILES(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<fraction{3, 2}>>>);
#endif
// The value itself, where the compiler takes a floating-point template argument (g++, not clang 14).
#if __cpp_nontype_template_args >= 201911L
CHECK_COMPILES(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<0.5>>>);
#endif
#ifdef CASE_O6__value
#if __cpp_nontype_template_args >= 201911L
CHECK_COMPILES(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<1.5>>>);
#else
CHECK_COMPILES(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<fraction{3, 2}>>>);
#endif
#endif
TWIN(config<offload<offload_modules<offload_module::fused_group_mlp>>, model<te_op_fuser>>);
#ifdef CASE_O7
CHECK_COMPILES(config<offload<offload_modules<offload_module::fused_group_mlp>>>);
#endif
TWIN(config<lo, modules<capture::attention>, offload<offload_modules<offload_module::expert_fc1>>>);
#ifdef CASE_OC1
CHECK_COMPILES(config<lo, modules<capture::attention>, off_core>);
#endif
#ifdef CASE_OC2
CHECK_COMPILES(config<lo, offload<offload_modules<offload_module::expert_fc1>>>);
#endif
TWIN(config<tr, modules<capture::attention>, off_core>);
#ifdef CASE_OC3
// local with expert offloads is "partial MoE offload" only while moe itself is not captured.
CHECK_COMPILES(config<lo, modules<capture::moe>, model<experts<8>, capacity_factor<fraction{1, 1}>, pad_to_capacity>,
                      offload<offload_modules<offload_module::expert_fc1>>>);
#endif
#ifdef CASE_OC4
CHECK_COMPILES(config<tr, modules<capture::moe>, model<experts<8>, capacity_factor<fraction{1, 1}>, pad_to_capacity>, off_core>);
#endif
#ifdef CASE_OC5
CHECK_COMPILES(config<tr, modules<capture::attention>, off_core, warmup_steps<0>>);
#endif
TWIN(config<impl::whole_iteration, no_nan_check, offload<offload_modules<offload_module::core_attn>, max_inflight_offloads<0>>>);
#ifdef CASE_OC6
CHECK_COMPILES(config<impl::whole_iteration, no_nan_check, off_core>);
#endif
TWIN(config<tr, modules<capture::mlp>, offload<offload_modules<offload_module::attn_norm>>>);
#ifdef CASE_OB1
CHECK_COMPILES(config<tr, modules<capture::attention>, offload<offload_modules<offload_module::attn_norm, offload_module::core_attn>>>);
#endif
TWIN(config<tr, modules<capture::attention, capture::mlp>, offload<offload_modules<offload_module::mlp_norm>>>);
#ifdef CASE_OB2
CHECK_COMPILES(config<tr, modules<capture::attention>, offload<offload_modules<offload_module::mlp_norm>>>);
#endif

// ---- training loop and FSDP -------------------------------------------------------------
TWIN(config<tr, modules<capture::attention>, model<expert_parallel_comm_overlap>>);
#ifdef CASE_E1
CHECK_COMPILES(config<tr, modules<capture::mlp>, model<expert_parallel_comm_overlap>>);
#endif
TWIN(config<lo, inference::per_block, fp8<fp8_format::hybrid>, fp8_scaling<fp8_recipe::mxfp8>,
                      transformer<transformer_impl::inference_optimized>>);
#ifdef CASE_A2
CHECK_COMPILES(config<lo, inference::per_block, fp8<fp8_format::hybrid>>);
#endif
// A1: the NaN check syncs the host inside a whole-step graph; capscope's check on the device does not.
TWIN(config<impl::whole_iteration, nan_check_on_device>);
TWIN(config<impl::whole_iteration, no_nan_check>);
#ifdef CASE_A1
CHECK_COMPILES(config<impl::whole_iteration>);
#endif
TWIN(config<lo, dynamic_batching_graphs<-1>>);
#ifdef CASE_A3
CHECK_COMPILES(config<lo, dynamic_batching_graphs<0>>);
#endif
TWIN(config<impl::eager, pipeline_parallel_inference<64>>);
#ifdef CASE_A6
CHECK_COMPILES(config<lo, pipeline_parallel_inference<64>>);
#endif
TWIN(config<impl::whole_iteration, no_nan_check, model<expert_parallel_comm_overlap>, megatron_fsdp<fsdp_mode::v1>>);
#ifdef CASE_X10
CHECK_COMPILES(config<tr, model<expert_parallel_comm_overlap>, megatron_fsdp<fsdp_mode::v1>>);
#endif
TWIN(config<impl::eager, megatron_fsdp<fsdp_mode::v2>>);
#ifdef CASE_X11
CHECK_COMPILES(config<tr, megatron_fsdp<fsdp_mode::v2>>);
#endif
TWIN(config<tr, megatron_fsdp<fsdp_mode::v1, fsdp_double_buffer, fsdp_persistent_buffer_on_alloc_fail>>);
TWIN(config<tr, megatron_fsdp<fsdp_mode::v1, fsdp_nccl_user_buffers, fsdp_persistent_buffer_on_alloc_fail>>);
#ifdef CASE_F1
CHECK_COMPILES(config<tr, megatron_fsdp<fsdp_mode::v1, fsdp_persistent_buffer_on_alloc_fail>>);
#endif
#ifdef CASE_F2
CHECK_COMPILES(config<tr, megatron_fsdp<fsdp_mode::v1, fsdp_double_buffer>>);
#endif

// ---- vision encoder ---------------------------------------------------------------------
TWIN(config<vision<tr, modules<capture::attention, capture::mlp>, max_seq_length<784>>>);
#ifdef CASE_V1
CHECK_COMPILES(config<vision<lo, max_seq_length<784>>>);
#endif
#ifdef CASE_V2
CHECK_COMPILES(config<vision<tr, modules<capture::moe>, max_seq_length<784>>>);
#endif
#ifdef CASE_V3
CHECK_COMPILES(config<vision<tr, max_seq_length<-1>>>);
#endif

// ---- spelling: each kind of option once, real values that are numbers, options only ----
// (config rules K1-K3, capscope/config/spelling.hpp; checked before any rule of the table)
TWIN(config<tr, model<layers<4>, experts<8>, capacity_factor<fraction{5, 4}>>>);
TWIN(config<offload<offload_modules<offload_module::core_attn>, offload_module_named<"attn_proj">, offload_fraction<fraction{1, 2}>>>);
TWIN(config<model<attention_dropout<fraction{1, 1, -100}>>>); // 2^-100, exactly
#ifdef CASE_K1
CHECK_COMPILES(config<tr, impl::eager>);
#endif
#ifdef CASE_K1__model
CHECK_COMPILES(config<tr, model<layers<4>, experts<8>, experts<1>>>); // the last would make the model dense
#endif
#ifdef CASE_K1__offload
CHECK_COMPILES(config<offload<offload_modules<offload_module::core_attn>, offload_fraction<fraction{1, 2}>, offload_fraction<fraction{1, 4}>>>);
#endif
#ifdef CASE_K1__vision
CHECK_COMPILES(config<vision<tr, max_seq_length<784>, max_seq_length<1024>>>);
#endif
#ifdef CASE_K2
CHECK_COMPILES(config<tr, model<attention_dropout<fraction{0, 0}>>>);
#endif
#ifdef CASE_K3
CHECK_COMPILES(config<tr, int>);
#endif

int main() { return 0; }
