// Compile-fail cases of the plan rules: P1, P2, P8 (a configuration that captures a stage its
// layer schema says cannot be captured), P9 (named regions that match no stage), P4 (bucket lists), P5 (an inference runner's buckets), P11 (offloading across a graph boundary), P14 and P15 (guarded stages). As is, every valid twin must compile; with
// -DCASE_<ID>[__variant] the first error must read "capscope plan rule <ID>:" (check.py).
// The configuration and the host-only plan, not the whole of capscope.hpp.
#include <capscope/config.hpp>
#include <capscope/plan.hpp>
#if __has_include(<cuda_runtime_api.h>)
#include <capscope/run/inference_runner.hpp>
#endif

using namespace capscope;

#define CHECK_COMPILES(...) static_assert(sizeof(__VA_ARGS__) > 0)
// A valid twin, left out of a broken case's compile (CAPSCOPE_ONE_CASE): check.py checks the twins once.
#if defined(CAPSCOPE_ONE_CASE)
#define TWIN(...)
#else
#define TWIN(...) static_assert(sizeof(__VA_ARGS__) > 0)
#endif

using moe_dropless = layer_schema<"moe_dropless", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                  stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>>,
                                  stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, synchronizes_with_host>,
                                  stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
using experts_only = layer_schema<"experts", stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
using dropless = model<experts<8>>;
using drop_and_pad = model<experts<8>, capacity_factor<fraction{1, 1}>, pad_to_capacity>;

// P1: the dropless preprocess reads counts back to the host.
TWIN(layer_plan<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>, dropless>, moe_dropless>);
#ifdef CASE_P1
CHECK_COMPILES(layer_plan<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router, capture::moe_preprocess>, dropless>,
                          moe_dropless>);
#endif
TWIN(layer_plan<config<impl::lazy_per_layer, modules<capture::attention>, dropless>, moe_dropless>);
#ifdef CASE_P1__whole_layer
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<>, dropless>, moe_dropless>);
#endif
TWIN(layer_plan<config<impl::eager>, moe_dropless>);
#ifdef CASE_P1__whole_iteration
CHECK_COMPILES(layer_plan<config<impl::whole_iteration, no_nan_check>, moe_dropless>);
#endif
// P2: expert GEMMs sized by data.
TWIN(layer_plan<config<impl::lazy_per_layer, modules<capture::attention>, drop_and_pad>, experts_only>);
#ifdef CASE_P2
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<capture::moe>, drop_and_pad>, experts_only>);
#endif
// P8: a stage that passes a host value (a dropout seed) to its kernels at launch.
using seeded_dropout = layer_schema<"seeded", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                    stage_decl<stage_kind::mlp, regions<capture::mlp>, passes_host_values>>;
TWIN(layer_plan<config<impl::lazy_per_layer, modules<capture::attention>>, seeded_dropout>);
#ifdef CASE_P8
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>>, seeded_dropout>);
#endif
TWIN(layer_plan<config<impl::eager>, seeded_dropout>);
// Updated in the graph before each replay, the same stage is captured with its layer, and in the whole step.
using updated_dropout = layer_schema<"updated", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                     stage_decl<stage_kind::mlp, regions<capture::mlp>, updated_in_graph>>;
TWIN(layer_plan<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>>, updated_dropout>);
TWIN(layer_plan<config<impl::whole_iteration, no_nan_check>, updated_dropout>);
#ifdef CASE_P8__whole_iteration
CHECK_COMPILES(layer_plan<config<impl::whole_iteration, no_nan_check>, seeded_dropout>);
#endif
// Lanes: a side-lane stage and a stage that waits for it plan like any other.
using reduced = layer_schema<"reduced", stage_decl<stage_kind::mlp, regions<capture::mlp>>,
                             stage_decl<stage_kind::other, regions<capture::mlp>, on_lane<1>>>;
static_assert(layer_plan<config<impl::lazy_per_layer, modules<capture::mlp>>, reduced>::graphs == 2); // one per lane
// A trainer's own kinds and regions (not Megatron's): a residual block whose branch is
// captured and whose gate reads back to the host.
using residual_block = layer_schema<"residual", stage_decl<kind<"branch">, regions<region<"branch">>>,
                                    stage_decl<kind<"gate">, regions<region<"gate">>, synchronizes_with_host>>;
static_assert(layer_plan<config<impl::lazy_per_layer, capture_regions<"branch">>, residual_block>::graphs == 1);
static_assert(layer_plan<config<impl::lazy_per_layer, capture_regions<"branch">>, residual_block>::eager_islands == 1);
// A schema names regions by capture module or region<"name">, checked where regions<...> is named.
using branch_regions = regions<capture::mlp, region<"branch">>;
#ifdef CASE_SCHEMA__regions
using bad_regions = regions<capture::mlp, int>;
#endif
// P9: named regions that no stage is in capture nothing.
TWIN(layer_plans<config<impl::lazy_per_layer, capture_regions<"branch">>, residual_block>);
#ifdef CASE_P9
CHECK_COMPILES(layer_plans<config<impl::lazy_per_layer, modules<capture::attention>>, residual_block>);
#endif
#ifdef CASE_P1__own_kind
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, capture_regions<"branch", "gate">>, residual_block>);
#endif

// P4: bucket lists are positive and strictly increasing.
TWIN(config<impl::lazy_per_layer, inference::per_layer, buckets<1, 2, 4, 8>>);
#ifdef CASE_P4
CHECK_COMPILES(config<impl::lazy_per_layer, inference::per_layer, buckets<4, 2, 8>>);
#endif
TWIN(config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<16, 32, 64>>);
#ifdef CASE_P4__length_repeated
CHECK_COMPILES(config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<16, 16, 64>>);
#endif
TWIN(config<impl::lazy_per_layer, inference::per_layer, megatron_buckets<16, 512>>);
#ifdef CASE_P4__megatron_zero_graphs
CHECK_COMPILES(config<impl::lazy_per_layer, inference::per_layer, megatron_buckets<0, 512>>);
#endif
// P5: an inference runner needs its buckets; a vision runner the length it pads to.
TWIN(inference_settings<config<impl::lazy_per_layer, inference::per_block, buckets<1, 8>>>::value);
#ifdef CASE_P5
CHECK_COMPILES(inference_settings<config<impl::lazy_per_layer, inference::per_block>>::value);
#endif
#if __has_include(<cuda_runtime_api.h>)
// ... and where the runner type is named, before any runner is built.
using server = inference_runner<config<impl::lazy_per_layer, inference::per_block, buckets<1, 8>>>;
#ifdef CASE_P5__runner_named
using bucketless_server = inference_runner<config<impl::lazy_per_layer, inference::per_block>>;
#endif
#endif
TWIN(vision_inference_settings<config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>>>::value);
#ifdef CASE_P5__vision_no_length
CHECK_COMPILES(vision_inference_settings<config<vision<impl::ahead_of_time_per_layer>>>::value);
#endif
TWIN(vision_inference_settings<config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<32, 64>>>::value);
#ifdef CASE_P5__length_past_max
CHECK_COMPILES(vision_inference_settings<config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<32, 128>>>::value);
#endif

int main() {}
// P11: an offloaded tensor whose producer and keeper a graph boundary separates. Local captures
// moe_router with moe_preprocess (S1); the preprocess writes expert_fc1, the eager experts keep it.
using moe_keeping = layer_schema<"moe_keeping", stage_decl<stage_kind::attention, regions<capture::attention>, makes<offload_module::mlp_norm>>,
                                 stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>, saves<offload_module::mlp_norm>>,
                                 stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, makes<offload_module::expert_fc1>>,
                                 stage_decl<stage_kind::moe_experts, regions<capture::moe>, saves<offload_module::expert_fc1, offload_module::moe_act>>>;
using local_moe = modules<capture::attention, capture::moe_router, capture::moe_preprocess>;
TWIN(layer_plan<config<impl::lazy_per_layer, local_moe, drop_and_pad, offload<offload_modules<offload_module::moe_act>>>, moe_keeping>);
#ifdef CASE_P11
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, local_moe, drop_and_pad, offload<offload_modules<offload_module::expert_fc1>>>, moe_keeping>);
#endif
// A trainer's own regions around Megatron's stages: attention captured, the MLP not (rule OB2
// reads Megatron's modules only; P11 reads the stages).
using dense_keeping = layer_schema<"dense_keeping", stage_decl<stage_kind::attention, regions<region<"left">>, makes<offload_module::mlp_norm>>,
                                   stage_decl<stage_kind::mlp, regions<region<"right">>, saves<offload_module::mlp_norm>>>;
using norm_offload = offload<offload_modules<offload_module::mlp_norm>>;
TWIN(layer_plan<config<impl::ahead_of_time_per_layer, capture_regions<"left", "right">, norm_offload>, dense_keeping>);
TWIN(layer_plan<config<impl::whole_iteration, no_nan_check, offload<offload_modules<offload_module::mlp_norm>, max_inflight_offloads<1>>>, dense_keeping>);
#ifdef CASE_P11__mlp_norm
CHECK_COMPILES(layer_plan<config<impl::ahead_of_time_per_layer, capture_regions<"left">, norm_offload>, dense_keeping>);
#endif
// A trainer's own tensor and stages: the note under the error names the tensor (g++:
// P11<capscope::detail::offload_tensor{"mixer_in"}, ...>; clang++ prints its characters' codes).
using own_keeping = layer_schema<"own_keeping", stage_decl<kind<"mixer">, regions<region<"mix">>, makes_named<"mixer_in">>,
                                 stage_decl<kind<"gate">, regions<region<"gate">>, saves_named<"mixer_in">>>;
TWIN(layer_plan<config<impl::ahead_of_time_per_layer, capture_regions<"mix", "gate">, offload<offload_tensors<"mixer_in">>>, own_keeping>);
#ifdef CASE_P11__own_tensor
CHECK_COMPILES(layer_plan<config<impl::ahead_of_time_per_layer, capture_regions<"mix">, offload<offload_tensors<"mixer_in">>>, own_keeping>);
#endif
// P14, P15: guarded stages (conditional nodes when captured). A loop inside a layer: `start`
// writes the flag, `pass` runs while it holds and writes it again; an optimizer-like stage runs
// if a flag written before the layer holds.
using looping = layer_schema<"looping", stage_decl<kind<"start">, regions<region<"loop">>, writes_flags<"again">>,
                             stage_decl<kind<"pass">, regions<region<"loop">>, run_while_holds<"again">, writes_flags<"again">>,
                             stage_decl<kind<"update">, regions<region<"loop">>, run_if_holds<"all_finite", flag_writer::before_layer>>>;
TWIN(layer_plan<config<impl::whole_iteration, no_nan_check>, looping>);
TWIN(layer_plan<config<impl::eager>, looping>);
// P14: a guarded stage that reads back to the host (left eager here, so P1 does not fire first).
#ifdef CASE_P14
using guarded_sync = layer_schema<"guarded_sync", stage_decl<kind<"start">, regions<region<"a">>, writes_flags<"again">>,
                                  stage_decl<kind<"pass">, regions<region<"b">>, run_if_holds<"again">, synchronizes_with_host>>;
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, capture_regions<"a">>, guarded_sync>);
#endif
// P15: the flag is written by no earlier stage (nor said to be written before the layer).
#ifdef CASE_P15
using unwritten = layer_schema<"unwritten", stage_decl<kind<"pass">, regions<region<"loop">>, run_if_holds<"again">>,
                               stage_decl<kind<"start">, regions<region<"loop">>, writes_flags<"again">>>;
CHECK_COMPILES(layer_plan<config<impl::whole_iteration, no_nan_check>, unwritten>);
#endif
// P15: a WHILE run that never writes its flag.
#ifdef CASE_P15__loop_never_ends
using endless = layer_schema<"endless", stage_decl<kind<"start">, regions<region<"loop">>, writes_flags<"again">>,
                             stage_decl<kind<"pass">, regions<region<"loop">>, run_while_holds<"again">>>;
CHECK_COMPILES(layer_plan<config<impl::whole_iteration, no_nan_check>, endless>);
#endif
