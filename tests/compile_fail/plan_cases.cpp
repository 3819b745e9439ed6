// Compile-fail cases of the plan rules (P1, P2): a configuration that captures a stage its
// layer schema says cannot be captured. As is, every valid twin must compile; with
// -DCASE_<ID>[__variant] the first error must read "capscope plan rule <ID>:" (check.py).
#include <capscope/capscope.hpp>

using namespace capscope;

#define CHECK_COMPILES(...) static_assert(sizeof(__VA_ARGS__) > 0)

using moe_dropless = layer_schema<"moe_dropless", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                  stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>>,
                                  stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, synchronizes_with_host>,
                                  stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
using experts_only = layer_schema<"experts", stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
using dropless = model<experts<8>>;
using drop_and_pad = model<experts<8>, capacity_factor<1.0>, pad_to_capacity>;

// P1: the dropless preprocess reads counts back to the host.
CHECK_COMPILES(layer_plan<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>, dropless>, moe_dropless>);
#ifdef CASE_P1
CHECK_COMPILES(layer_plan<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router, capture::moe_preprocess>, dropless>,
                          moe_dropless>);
#endif
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<capture::attention>, dropless>, moe_dropless>);
#ifdef CASE_P1__whole_layer
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<>, dropless>, moe_dropless>);
#endif
CHECK_COMPILES(layer_plan<config<impl::eager>, moe_dropless>);
#ifdef CASE_P1__whole_iteration
CHECK_COMPILES(layer_plan<config<impl::whole_iteration, no_nan_check>, moe_dropless>);
#endif
// P2: expert GEMMs sized by data.
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<capture::attention>, drop_and_pad>, experts_only>);
#ifdef CASE_P2
CHECK_COMPILES(layer_plan<config<impl::lazy_per_layer, modules<capture::moe>, drop_and_pad>, experts_only>);
#endif

int main() {}
