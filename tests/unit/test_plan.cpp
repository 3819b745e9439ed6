// The plan, on the host (no GPU): segments, capture order, graph sharing across microbatches,
// the plan-time errors, text and DOT, compile-time layer plans, and the bind-time schema check.

#include "fake_program.hpp"
#include "plan_helpers.hpp"

#include <capscope/capscope.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace capscope;
using namespace plan_helpers;

namespace {

using moe4 = model<experts<4>, moe_pattern<0, 1, 0>, capacity_factor<fraction{1, 1}>, pad_to_capacity>;
using moe4_dropless = model<experts<4>, moe_pattern<0, 1, 0>>;


} // namespace

TEST_CASE("eager: every stage is its own layer's eager island; no graphs") {
    fake::model m;
    const auto p = m.program("DE", false, 1);
    const auto plan = plan_for<config<impl::eager>>(p);
    CHECK(plan.graph_count == 0);
    CHECK(summary(plan, p, phase::forward, 0) ==
          "e:embedding e:layer0.attention+layer0.mlp e:layer1.attention+layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts e:head");
    CHECK(summary(plan, p, phase::backward, 0) ==
          "e:head e:layer1.moe_experts+layer1.moe_preprocess+layer1.moe_router+layer1.attention e:layer0.mlp+layer0.attention e:embedding");
}

TEST_CASE("whole layers: one graph per layer and phase, numbered forward in layer order then backward in reverse") {
    fake::model m;
    const auto p = m.program("DEM", false, 1);
    const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<>, moe4>>(p);
    CHECK(plan.graph_count == 6);
    CHECK(summary(plan, p, phase::forward, 0) ==
          "e:embedding g0:layer0.attention+layer0.mlp "
          "g1:layer1.attention+layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts g2:layer2.mamba e:head");
    CHECK(summary(plan, p, phase::backward, 0) ==
          "e:head g3:layer2.mamba g4:layer1.moe_experts+layer1.moe_preprocess+layer1.moe_router+layer1.attention "
          "g5:layer0.mlp+layer0.attention e:embedding");
    // Step-level work stays eager around the microbatches.
    CHECK(plan.segments.front().part == step_part::step_begin);
    CHECK_FALSE(plan.segments.front().graphed);
    CHECK(plan.segments.back().part == step_part::step_end);
    CHECK(plan.graph_launches_per_step() == 6);
    CHECK(plan.eager_islands_per_step() == 6); // zero_grad, embedding x2, head x2, optimizer
}

TEST_CASE("consecutive captured regions of a layer form one graph; the rest are eager islands") {
    fake::model m;
    const auto p = m.program("DEM", false, 1);
    SUBCASE("attn + mlp") {
        const auto plan = plan_for<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, moe4>>(p);
        CHECK(summary(plan, p, phase::forward, 0) ==
              "e:embedding g0:layer0.attention+layer0.mlp g1:layer1.attention "
              "e:layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts e:layer2.mamba e:head");
    }
    SUBCASE("attn + moe_router + moe_preprocess under drop-and-pad") {
        const auto plan = plan_for<config<impl::lazy_per_layer, modules<capture::attention, capture::moe_router, capture::moe_preprocess>, moe4>>(p);
        CHECK(summary(plan, p, phase::forward, 0) ==
              "e:embedding g0:layer0.attention e:layer0.mlp g1:layer1.attention+layer1.moe_router+layer1.moe_preprocess "
              "e:layer1.moe_experts e:layer2.mamba e:head");
    }
    SUBCASE("moe: the whole MoE block, not its attention") {
        const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<capture::moe>, moe4>>(p);
        CHECK(summary(plan, p, phase::forward, 0) ==
              "e:embedding e:layer0.attention+layer0.mlp e:layer1.attention "
              "g0:layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts e:layer2.mamba e:head");
    }
    SUBCASE("mamba") {
        const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<capture::mamba>, moe4>>(p);
        CHECK(plan.graph_count == 2);
        CHECK(summary(plan, p, phase::backward, 0) ==
              "e:head g1:layer2.mamba e:layer1.moe_experts+layer1.moe_preprocess+layer1.moe_router+layer1.attention "
              "e:layer0.mlp+layer0.attention e:embedding");
    }
}

TEST_CASE("dropless MoE: the router is captured, the host-synchronizing preprocess and the experts stay eager") {
    fake::model m;
    const auto p = m.program("E", true, 1);
    const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>, moe4_dropless>>(p);
    CHECK(summary(plan, p, phase::forward, 0) ==
          "e:embedding g0:layer0.attention+layer0.moe_router e:layer0.moe_preprocess+layer0.moe_experts e:head");
    CHECK(summary(plan, p, phase::backward, 0) ==
          "e:head e:layer0.moe_experts+layer0.moe_preprocess g1:layer0.moe_router+layer0.attention e:embedding");
}

TEST_CASE("a stage that cannot be captured inside a captured region is a plan error naming the stage and the fix") {
    fake::model m;
    const auto p = m.program("DE", true, 1);
    const capture_module_set router_pre{capture_module::attention, capture_module::moe_router, capture_module::moe_preprocess};
    CHECK(plan_error_text({graph_impl::ahead_of_time_per_layer, router_pre}, p) ==
          "capscope plan rule P1: stage 'layer1.moe_preprocess' synchronizes with the host, yet modules {attn, moe_router, "
          "moe_preprocess} capture it under impl transformer_engine -- fix: drop moe_preprocess from the modules (capture "
          "moe_router only), or make the MoE drop-and-pad");
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {capture_module::moe}}, p) ==
          "capscope plan rule P1: stage 'layer1.moe_preprocess' synchronizes with the host, yet modules {moe} capture it "
          "under impl local -- fix: drop moe from the modules (capture moe_router only), or make the MoE drop-and-pad");
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {}}, p) ==
          "capscope plan rule P1: stage 'layer1.moe_preprocess' synchronizes with the host, yet impl local captures whole "
          "layers, this one included -- fix: name the regions to capture instead of the whole layer (modules<>), leaving "
          "out moe, moe_preprocess");
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, p) ==
          "capscope plan rule P1: stage 'layer1.moe_preprocess' synchronizes with the host, yet impl full_iteration "
          "captures it -- fix: use a per-layer impl (local or transformer_engine) whose modules leave out moe, "
          "moe_preprocess, or make the stage capturable");
    // Data-dependent shapes alone (P2): a preprocess that does not synchronize, experts that do depend on data.
    auto q = p;
    for (auto& st : q.microbatches[0]) st.synchronizes_with_host = false;
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {capture_module::moe}}, q) ==
          "capscope plan rule P2: stage 'layer1.moe_experts' has launch shapes that depend on data, yet modules {moe} "
          "capture it under impl local -- fix: drop moe from the modules (capture moe_router [+ moe_preprocess] instead), "
          "or make the MoE drop-and-pad");
    // A stage outside the layers: regions say nothing there; a per-layer impl leaves it eager.
    auto r = m.program("D", false, 1);
    r.microbatches[0].back().synchronizes_with_host = true; // the head reads a loss back
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, r) ==
          "capscope plan rule P1: stage 'head' synchronizes with the host, yet impl full_iteration captures it -- fix: use a per-layer "
          "impl (local or transformer_engine), which captures layer stages only and leaves this stage, outside the layers, eager; or "
          "make the stage capturable");
    // The error carries the rule and the stage for programs that want them.
    try {
        make_training_plan({graph_impl::lazy_per_layer, {}}, 0, p);
        FAIL("no plan error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P1");
        CHECK(e.stage() == "layer1.moe_preprocess");
    }
}

TEST_CASE("microbatches share the graphs of identically bound stages; per-microbatch buffers get their own") {
    fake::model m;
    auto p = m.program("DD", false, 2);
    const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<>>>(p);
    CHECK(plan.graph_count == 4);
    CHECK(summary(plan, p, phase::forward, 1) == "e:embedding.mb1 g0s:layer0.attention+layer0.mlp g1s:layer1.attention+layer1.mlp e:head.mb1");
    CHECK(summary(plan, p, phase::backward, 1) == "e:head.mb1 g2s:layer1.mlp+layer1.attention g3s:layer0.mlp+layer0.attention e:embedding.mb1");
    CHECK(plan.graph_launches_per_step() == 8);

    // Bind microbatch 1's layer-1 attention to another buffer: its segments need graphs of their own.
    static char other = 0;
    p.microbatches[1][3].outputs[0].data = &other;
    const auto split = plan_for<config<impl::ahead_of_time_per_layer, modules<>>>(p);
    CHECK(split.graph_count == 6);
    CHECK(summary(split, p, phase::forward, 1) == "e:embedding.mb1 g0s:layer0.attention+layer0.mlp g4:layer1.attention+layer1.mlp e:head.mb1");
    CHECK(summary(split, p, phase::backward, 1) == "e:head.mb1 g5:layer1.mlp+layer1.attention g3s:layer0.mlp+layer0.attention e:embedding.mb1");
}

TEST_CASE("whole iteration: every microbatch, the step begin and the optimizer in one graph") {
    fake::model m;
    const auto p = m.program("DEM", false, 2);
    const auto plan = plan_for<config<impl::whole_iteration, no_nan_check>>(p);
    REQUIRE(plan.segments.size() == 1);
    CHECK(plan.segments[0].graphed);
    CHECK(plan.graph_count == 1);
    // zero_grad + 2 x (9 forward + 9 backward: embedding, 7 layer stages, head) + optimizer
    CHECK(plan.segments[0].call_count == 1 + 2 * 18 + 1);
    CHECK(stage_of(p, plan.calls.front()).name == "zero_grad");
    CHECK(stage_of(p, plan.calls.back()).name == "optimizer");
}

TEST_CASE("the program's shape is checked: microbatches run the same stages") {
    fake::model m;
    auto p = m.program("DE", false, 2);
    p.microbatches[1][2].captured_by = {capture_module::moe};
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {}}, p) ==
          "capscope plan rule P3: stage 2 of microbatch 1 ('layer0.mlp') differs from microbatch 0's ('layer0.mlp') in kind, "
          "layer, regions or capture facts -- fix: every microbatch runs the same stages (only their buffers may differ)");
    p.microbatches.clear();
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {}}, p).find("has no microbatch") != std::string::npos);
    auto q = m.program("D", false, 1);
    q.microbatches[0][1].backward = {};
    q.microbatches[0][1].forward = {};
    CHECK(plan_error_text({graph_impl::eager, {}}, q).find("stage 'layer0.attention' has neither a forward nor a backward function") !=
          std::string::npos);
    auto r = m.program("D", false, 1);
    r.step_end[0].forward = {};
    r.step_end[0].backward = r.microbatches[0][1].backward;
    CHECK(plan_error_text({graph_impl::eager, {}}, r).find("step-level stage 'optimizer' has no forward function") != std::string::npos);
    auto lanes = m.program("D", false, 1);
    lanes.microbatches[0][1].lane = max_lanes + 1;
    CHECK(plan_error_text({graph_impl::eager, {}}, lanes).find("stage 'layer0.attention' is on lane 9, outside 0..8") != std::string::npos);
}

TEST_CASE("the plan prints as text and as Graphviz DOT") {
    fake::model m;
    const auto p = m.program("DE", false, 2);
    const auto plan = plan_for<config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, moe4, warmup_steps<2>>>(p);
    const std::string text = to_text(plan, p);
    CHECK(text.find("capscope plan: impl local (lazy_per_layer), modules {attn, mlp}, 2 microbatches\n") == 0);
    CHECK(text.find("  4 graphs: each captured the first time it runs, after 2 eager warmup steps\n") != std::string::npos);
    CHECK(text.find("per step: 8 graph launches, 14 eager islands (22 stage calls)") != std::string::npos);
    CHECK(text.find("microbatch 0 forward\n  eager        embedding.mb0\n  graph g0     layer0.attention layer0.mlp\n") != std::string::npos);
    CHECK(text.find("microbatch 1 backward\n  eager        head.mb1\n") != std::string::npos);
    CHECK(text.find("graph g0 (shared with microbatch 0) layer0.attention layer0.mlp") != std::string::npos);
    const std::string dot = to_dot(plan, p);
    CHECK(dot.find("digraph capscope_plan {") == 0);
    CHECK(dot.find("label=\"microbatch 0 forward\"") != std::string::npos);
    CHECK(dot.find("[label=\"g0\\nlayer0.attention\\nlayer0.mlp\", style=\"filled,bold\"") != std::string::npos);
    CHECK(dot.find("[label=\"embedding.mb0\", style=dashed]") != std::string::npos);
    std::size_t nodes = 0;
    for (std::size_t at = dot.find(" [label="); at != std::string::npos; at = dot.find(" [label=", at + 1)) ++nodes;
    CHECK(nodes == plan.segments.size());
}

// ---- compile time: layer schemas and their plans ------------------------------------------------
namespace schemas {
using dense = layer_schema<"dense", stage_decl<stage_kind::attention, regions<capture::attention>>,
                           stage_decl<stage_kind::mlp, regions<capture::mlp>>>;
using moe_drop_and_pad = layer_schema<"moe", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                      stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>>,
                                      stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>>,
                                      stage_decl<stage_kind::moe_experts, regions<capture::moe>>>;
using moe_dropless = layer_schema<"moe_dropless", stage_decl<stage_kind::attention, regions<capture::attention>>,
                                  stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>>,
                                  stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, synchronizes_with_host>,
                                  stage_decl<stage_kind::moe_experts, regions<capture::moe>, shapes_depend_on_data>>;
using mamba = layer_schema<"mamba", stage_decl<stage_kind::mamba, regions<capture::mamba>>>;
} // namespace schemas

using attn_mlp = config<impl::lazy_per_layer, modules<capture::attention, capture::mlp>, moe4>;
static_assert(layer_plan<attn_mlp, schemas::dense>::graphs == 1);
static_assert(layer_plan<attn_mlp, schemas::dense>::segments[0] == stage_range{0, 2, true});
static_assert(layer_plan<attn_mlp, schemas::moe_drop_and_pad>::graphs == 1);
static_assert(layer_plan<attn_mlp, schemas::moe_drop_and_pad>::segments[1] == stage_range{1, 3, false});
static_assert(layer_plan<attn_mlp, schemas::mamba>::eager_islands == 1);
using router_only = config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>, moe4_dropless>;
static_assert(layer_plan<router_only, schemas::moe_dropless>::segments[0] == stage_range{0, 2, true});
static_assert(layer_plan<router_only, schemas::moe_dropless>::segments[1] == stage_range{2, 2, false});
static_assert(layer_plan<config<impl::whole_iteration, no_nan_check>, schemas::moe_drop_and_pad>::graphs == 1);
static_assert(layer_plan<config<impl::eager>, schemas::moe_dropless>::graphs == 0);

TEST_CASE("a program's layers are matched against the runner's layer schemas at bind time") {
    fake::model m;
    const layer_schemas<schemas::dense, schemas::moe_drop_and_pad, schemas::mamba> drop_and_pad;
    CHECK_NOTHROW(match_schemas(drop_and_pad, m.program("DEM", false, 2)));
    try {
        match_schemas(drop_and_pad, m.program("DEM", true, 1));
        FAIL("a dropless layer matched a drop-and-pad schema");
    } catch (const schema_mismatch& e) {
        const std::string what = e.what();
        CHECK(what.find("layer 1 of the model matches none of the runner's layer schemas (dense, moe, mamba)") != std::string::npos);
        CHECK(what.find("layer1.moe_preprocess: moe_preprocess {moe, moe_preprocess} synchronizes_with_host") != std::string::npos);
        CHECK(what.find("schema 'moe' has the same stages, but declares layer1.moe_preprocess as moe_preprocess {moe, moe_preprocess}") !=
              std::string::npos);
    }
    CHECK_NOTHROW(match_schemas(layer_schemas<schemas::dense, schemas::moe_dropless, schemas::mamba>{}, m.program("DEM", true, 1)));
}

TEST_CASE("engine options live beside the Megatron configuration") {
    using a = config<impl::lazy_per_layer, modules<capture::attention>, capture_with<capture_mode::global>,
                     on_capture_failure<capture_failure::run_eagerly>>;
    using b = config<impl::lazy_per_layer, modules<capture::attention>>;
    static_assert(a::engine.mode == capture_mode::global);
    static_assert(a::engine.on_failure == capture_failure::run_eagerly);
    static_assert(b::engine == engine_settings{});
    static_assert(b::engine.mode == capture_mode::per_thread);
    static_assert(same_config<a, b>); // select<> matches Megatron settings; these are not
    static_assert(b::warmup_steps == 3);
}

TEST_CASE("the run-time flag path: a Megatron command line selects a compile-time config, whose plan the runner would run") {
    using te_router = config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::moe_router>,
                             model<experts<4>, moe_pattern<0, 1, 0>>>;
    using lo_whole = config<impl::lazy_per_layer, modules<>, model<experts<4>, moe_pattern<0, 1, 0>>>;
    const std::vector<std::string> args = {"--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn", "moe_router",
                                           "--num-experts", "4", "--moe-layer-freq", "[0,1,0]"};
    const auto line = flags::from_megatron_flags(args);
    fake::model m;
    const auto p = m.program("DEM", true, 1);
    const std::string chosen = select<lo_whole, te_router>(line.config, [&](auto cfg) {
        using C = decltype(cfg);
        // What runner<C> plans at construction.
        return to_text(make_training_plan(capture_scope_of<C>, C::warmup_steps, p), p);
    });
    CHECK(chosen.find("capscope plan: impl transformer_engine (ahead_of_time_per_layer), modules {attn, moe_router}") == 0);
    CHECK(chosen.find("graph g1     layer1.attention layer1.moe_router\n  eager        layer1.moe_preprocess layer1.moe_experts") !=
          std::string::npos);
}
