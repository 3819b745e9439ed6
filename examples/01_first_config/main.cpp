// Tutorial 1: a CUDA-graph configuration the compiler checks (docs/01_first_config.md).
//
// 1. A configuration that compiles: a MoE model whose attention and router run in graphs
//    captured ahead of time (Megatron: --cuda-graph-impl transformer_engine
//    --cuda-graph-modules attn moe_router moe_preprocess).
// 2. One that does not (kept out of the build; see tests/compile_fail/cases.cpp, CASE_S2).
// 3. The same check at run time, from Megatron flags.
#include <capscope/capscope.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;

// 1. Checked when instantiated: every rule runs in a constant expression.
using moe_training = config<
    impl::ahead_of_time_per_layer,
    modules<capture::attention, capture::moe_router, capture::moe_preprocess>,
    model<layers<24>, experts<64>, dispatcher<token_dispatcher::alltoall>, attention_dropout<fraction{0, 1}>, hidden_dropout<fraction{0, 1}>>,
    warmup_steps<3>>;
static_assert(moe_training::modules.contains(capture_module::moe_router));

// 2. Capturing the whole MoE block *and* its router cannot work (rule S2). Uncommented, this reads:
//      error: static assertion failed: capscope rule S2: cuda_graph_modules must not contain both
//      moe and moe_router -- fix: capture either moe (the whole MoE block, drop-and-pad only) or
//      moe_router [+ moe_preprocess]
// using broken = config<impl::ahead_of_time_per_layer, modules<capture::moe, capture::moe_router>, model<experts<64>>>;
// static_assert(sizeof(broken));

int main() {
    std::printf("compile-time: impl=%s, %d captured modules, inference scope=%s\n",
                std::string(megatron_name(moe_training::impl)).c_str(), moe_training::modules.size(),
                std::string(megatron_name(moe_training::inference)).c_str());

    // 3. The same verdicts at run time, from a command line.
    std::vector<std::string> flags = {"--cuda-graph-impl", "transformer_engine", "--num-experts", "64",
                                      "--cuda-graph-modules", "moe", "moe_router"};
    validation_report report = validate(flags::from_megatron_flags(flags).config);
    std::printf("run-time: %s\n", report.valid() ? "valid" : "invalid");
    for (const finding& v : report.violations)
        std::printf("  [%s] %s\n      fix: %s\n", std::string(v.rule->id).c_str(), v.text().c_str(),
                    std::string(v.rule->fix).c_str());
    // The run-time check finds what the compile-time check would: S2 and S6 here.
    return report.violations.size() == 2 ? 0 : 1;
}
