// Compile-time enforcer and select<>: valid configs compile, verdicts match the run-time ones.
#include "rule_cases.hpp"

#include <doctest/doctest.h>
#include <capscope/emit_cpp.hpp>

#include <cmath>

using namespace capscope;

using dense_te = config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::mlp>>;
using moe_local = config<impl::lazy_per_layer, modules<capture::attention, capture::moe_router, capture::moe_preprocess>,
                         model<experts<8>, dispatcher<token_dispatcher::alltoall>>>;
using whole = config<impl::whole_iteration, no_nan_check, recompute<recompute_granularity::full>>;

static_assert(dense_te::impl == graph_impl::ahead_of_time_per_layer);
static_assert(moe_local::inference == inference_scope::per_layer); // derived default (N10)
static_assert(is_valid_config<impl::eager>);
static_assert(!is_valid_config<impl::whole_iteration>); // A1
static_assert(rejecting_rule<impl::whole_iteration> == "A1");
static_assert(rejecting_rule<impl::lazy_per_layer, modules<capture::moe_router>, model<experts<8>>> == "S1");
// Option order carries no meaning.
static_assert(same_config<config<model<experts<8>>, impl::lazy_per_layer, warmup_steps<2>>,
                          config<warmup_steps<2>, impl::lazy_per_layer, model<experts<8>>>>);
// Deprecated spellings migrate to the same configuration.
static_assert(same_config<config<deprecated::enable_cuda_graph, deprecated::cuda_graph_scope<capture::attention>>,
                          config<impl::lazy_per_layer, modules<capture::attention>>>);
static_assert(same_config<config<modules<deprecated::full_iteration>, no_nan_check>, config<impl::whole_iteration, no_nan_check>>);

TEST_CASE("compile-time and run-time enforcers agree on every rule case") {
    for (const auto& c : test::all_rule_cases()) {
        CAPTURE(c.id);
        for (const runtime_config& cfg : {c.holds, c.breaks}) {
            auto ct = find_first_rejection(cfg, enforcement::compile_time);
            auto rt = validate(cfg);
            bool rt_adjusted = false;
            for (const auto& n : rt.notes) rt_adjusted = rt_adjusted || n.rule->kind == rule_kind::adjustment;
            // Compile time rejects exactly what run time rejects, plus silent adjustments.
            CHECK(ct.accepted() == (rt.valid() && !rt_adjusted));
            if (!ct.accepted() && !rt.valid())
                CHECK(rule_table[static_cast<std::size_t>(ct.rule_index)].id == rt.violations.front().rule->id);
        }
    }
}

TEST_CASE("select calls f with the compile-time config equal to the run-time one") {
    runtime_config rc;
    rc.impl = graph_impl::lazy_per_layer;
    rc.num_experts = 8;
    rc.dispatcher = token_dispatcher::alltoall;
    rc.modules.modules = {capture_module::attention, capture_module::moe_router};
    rc.modules.entries = 2; // moe_preprocess is completed by S1, as Megatron does
    int chosen = select<dense_te, moe_local, whole>(rc, []<class Cfg>(Cfg) {
        if constexpr (std::is_same_v<Cfg, moe_local>) return 2;
        else return 0;
    });
    CHECK(chosen == 2);
}

TEST_CASE("select reports no match with the closest candidate's differences") {
    runtime_config rc;
    rc.impl = graph_impl::ahead_of_time_per_layer;
    rc.modules.modules = {capture_module::attention};
    rc.modules.entries = 1;
    try {
        select<dense_te, whole>(rc, [](auto) {});
        FAIL("expected no_matching_config");
    } catch (const no_matching_config& e) {
        std::string what = e.what();
        CHECK(what.find("modules: [attn] vs [attn, mlp]") != std::string::npos);
    }
}

TEST_CASE("select refuses an invalid run-time configuration with every violation") {
    runtime_config rc;
    rc.impl = graph_impl::whole_iteration;
    rc.modules.modules = {capture_module::attention};
    rc.modules.entries = 1;
    CHECK_THROWS_AS(select<whole>(rc, [](auto) {}), invalid_configuration);
    try {
        select<whole>(rc, [](auto) {});
    } catch (const invalid_configuration& e) {
        CHECK(std::string(e.what()).find("[N12]") != std::string::npos);
    }
}

TEST_CASE("select: a candidate that fixes some settings lets the others pass through") {
    // A real command line spells the layer count; the candidates do not.
    const auto line = flags::from_megatron_flags(std::vector<std::string>{"--cuda-graph-impl", "local", "--num-layers", "6"});
    using local_whole = config<impl::lazy_per_layer, modules<>>;
    CHECK_THROWS_AS(select<local_whole>(line.config, [](auto) {}), no_matching_config); // every setting must match
    using local_any_model = fixing<local_whole, "impl", "modules", "inference_scope">;
    using te_any_model = fixing<config<impl::ahead_of_time_per_layer, modules<>>, "impl", "modules">;
    const int chosen = select<te_any_model, local_any_model>(line.config, []<class Cfg>(Cfg) {
        return std::is_same_v<Cfg, local_whole> ? 1 : 0;
    });
    CHECK(chosen == 1);
    // Settings it fixes still must match: modules attn is not the whole layer.
    const auto attn = flags::from_megatron_flags(std::vector<std::string>{"--cuda-graph-impl", "local", "--cuda-graph-modules", "attn"});
    CHECK_THROWS_AS(select<local_any_model>(attn.config, [](auto) {}), no_matching_config);
    // A key that is no setting is a mistake, said as such.
    try {
        select<fixing<local_whole, "implementation">>(line.config, [](auto) {});
        FAIL("no error");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("no setting is named 'implementation'") != std::string::npos);
    }
}

// Real-valued options: the value itself (g++; clang 14 takes no floating-point template argument)
// or a fraction (every C++20 compiler) mean the same.
#if __cpp_nontype_template_args >= 201911L
static_assert(same_config<config<impl::eager, model<experts<8>, capacity_factor<fraction{5, 4}>, pad_to_capacity>>,
                          config<impl::eager, model<experts<8>, capacity_factor<1.25>, pad_to_capacity>>>);
#endif
static_assert(config<impl::eager, model<experts<8>, capacity_factor<fraction{5, 4}>, pad_to_capacity>>::normalized.expert_capacity_factor == 1.25);
static_assert(config<impl::eager, model<attention_dropout<fraction{1, 10}>>>::normalized.attention_dropout == 0.1);
static_assert(config<impl::eager, model<attention_dropout<fraction{0, 1}>>>::normalized.attention_dropout == 0.0);

// A binary exponent spells what no n/d does, exactly.
static_assert(config<model<attention_dropout<fraction{1, 1, -100}>>>::normalized.attention_dropout == 0x1p-100);
static_assert(config<model<attention_dropout<fraction{178405961588245, 1, -147}>>>::normalized.attention_dropout == 1e-30);
static_assert(config<model<hidden_dropout<fraction{1, 1, -1074}>>>::normalized.hidden_dropout == 5e-324); // the least subnormal
static_assert(config<model<capacity_factor<fraction{3, 1, 70}>>>::normalized.expert_capacity_factor == 3 * 0x1p70);

// How a config is spelled, before any rule (K1-K3): found without a diagnostic.
static_assert(rejecting_rule<impl::eager, impl::lazy_per_layer> == "K1");
static_assert(rejecting_rule<model<layers<4>, experts<8>, experts<1>>> == "K1"); // the last would make it dense
static_assert(rejecting_rule<model<moe_every<2>, moe_pattern<1, 0>>> == "K1");
static_assert(rejecting_rule<offload<offload_fraction<fraction{1, 2}>, offload_fraction<fraction{1, 4}>>> == "K1");
static_assert(rejecting_rule<vision<impl::ahead_of_time_per_layer, max_seq_length<784>, max_seq_length<1024>>> == "K1");
static_assert(rejecting_rule<model<attention_dropout<fraction{0, 0}>>> == "K2");
static_assert(rejecting_rule<offload<offload_modules<offload_module::core_attn>, offload_fraction<fraction{1, 0}>>> == "K2");
static_assert(rejecting_rule<impl::eager, int> == "K3");
static_assert(!is_valid_config<impl::eager, impl::eager> && !is_valid_config<impl::eager, int> && !is_valid_config<model<layers<4>, layers<8>>>);
// Module and tensor lists add up: they may repeat.
static_assert(is_valid_config<offload<offload_modules<offload_module::core_attn>, offload_module_named<"attn_proj">, offload_tensors<"x">, offload_tensors<"y">>>);

TEST_CASE("--emit-cpp writes real values as fraction{n, d}, which reads back exactly, or the value where none does") {
    using capscope::detail::cpp_real;
    CHECK(cpp_real(1.25) == "fraction{5, 4}");
    CHECK(cpp_real(0.1) == "fraction{1, 10}");
    CHECK(cpp_real(0.0) == "fraction{0, 1}");
    CHECK(cpp_real(2.0) == "fraction{2, 1}");
    CHECK(cpp_real(-0.5) == "fraction{-1, 2}");
    CHECK(cpp_real(1e-5) == "fraction{1, 100000}");
    // Where no n/d up to 10^18 gives it back: the double's own significand and power of two.
    CHECK(cpp_real(3e20) == "fraction{286102294921875, 1, 20}");
    CHECK(cpp_real(1e-30) == "fraction{178405961588245, 1, -147}");
    CHECK(cpp_real(12345678901234567890.0).rfind("fraction{", 0) == 0); // 20 digits: past 10^18, no throw
    CHECK(cpp_real(std::ldexp(1.0, 70)) == "fraction{1, 1, 70}");
    CHECK(cpp_real(5e-324) == "fraction{1, 1, -1074}");
    CHECK(cpp_real(HUGE_VAL) == "__builtin_inf()"); // no fraction spells inf or NaN: g++ only
    // Whatever it writes as a fraction gives back the same double.
    for (double v : {0.30000000000000004, 1.0 / 3.0, 0.7, 123.456, 1e-12, 6.02e17}) {
        std::string t = cpp_real(v);
        if (t.rfind("fraction{", 0) != 0) continue;
        long long n = std::stoll(t.substr(9)), d = std::stoll(t.substr(t.find(", ") + 2));
        CHECK_MESSAGE(double(n) / double(d) == v, t);
    }
}
