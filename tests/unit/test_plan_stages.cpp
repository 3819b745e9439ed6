// The stage seam's newer facts, on the host: stages with one phase, declared buffers and graph
// sharing, rules P8, P9 and P10, a region-less stage's fix, lanes, the open vocabulary of kinds
// and regions, and stream_fn holding a callable itself.

#include "fake_program.hpp"
#include "plan_helpers.hpp"

#include <capscope/capscope.hpp>

#include <cstdint>
#include <utility>

#include <doctest/doctest.h>

#include <string>
#include <type_traits>
#include <vector>

using namespace capscope;
using namespace plan_helpers;

TEST_CASE("stages without a backward (a frozen layer) or without a forward (a gradient reduction) plan their one phase") {
    fake::model m;
    auto p = m.program("DD", false, 1);
    p.microbatches[0][1].backward = {}; // layer0.attention is frozen
    p.microbatches[0][4].forward = {};  // layer1.mlp only reduces in backward
    const auto plan = plan_for<config<impl::lazy_per_layer, modules<>>>(p);
    CHECK(summary(plan, p, phase::forward, 0) == "e:embedding g0:layer0.attention+layer0.mlp g1:layer1.attention e:head");
    CHECK(summary(plan, p, phase::backward, 0) == "e:head g2:layer1.mlp+layer1.attention g3:layer0.mlp e:embedding");
}

TEST_CASE("graphs are shared across microbatches only for stages that declare their buffers; the plan says which stage did not") {
    fake::model m;
    auto p = m.program("DD", false, 2);
    // layer0.mlp reads a per-microbatch buffer through its own state, and does not say so.
    p.microbatches[0][2].buffers_declared = p.microbatches[1][2].buffers_declared = false;
    const auto plan = plan_for<config<impl::ahead_of_time_per_layer, modules<>>>(p);
    CHECK(plan.graph_count == 6); // layer 0's forward and backward graphs are per microbatch now
    CHECK(summary(plan, p, phase::forward, 1) == "e:embedding.mb1 g4:layer0.attention+layer0.mlp g1s:layer1.attention+layer1.mlp e:head.mb1");
    const std::string text = to_text(plan, p);
    CHECK(text.find("graph g4     layer0.attention layer0.mlp  [own graph: 'layer0.mlp' does not declare its buffers "
                    "(stage::buffers_declared)]") != std::string::npos);
    stage a = p.microbatches[0][2], b = p.microbatches[1][2];
    CHECK_FALSE(a.same_binding(b)); // identical functions and declared buffers, but undeclared
    a.buffers_declared = b.buffers_declared = true;
    CHECK(a.same_binding(b));
}

TEST_CASE("a declared buffer that covers no memory (no address, 0 bytes, an end past the address space) is refused, naming it") {
    // It would overlap nothing, so a lane-1 writer and a later step-stream reader of it would get no wait.
    fake::model m;
    training_program p = m.program("DD", false, 1);
    int g = 0;
    p.microbatches[0].back().outputs.push_back({"G.ok", &g, sizeof g});
    CHECK(plan_error_text(capture_scope_of<config<impl::eager>>, p) == "(no error)");
    const std::pair<tensor_ref, const char*> wrong[] = {{tensor_ref{"G", &g}, "has 0 bytes"},
                                                        {tensor_ref{"G", nullptr, 4}, "has no address"},
                                                        {tensor_ref{"G", &g, SIZE_MAX}, "ends past the address space"}};
    for (const auto& [bad, why] : wrong) {
        training_program q = p;
        q.microbatches[0].back().outputs.push_back(bad);
        const std::string text = plan_error_text(capture_scope_of<config<impl::eager>>, q);
        CHECK_MESSAGE(text.find("capscope plan rule P3: stage '" + q.microbatches[0].back().name + "' declares buffer 'G' (an output), which " +
                                why) != std::string::npos, text);
        training_program r = p; // the layers' parameters and gradients too, but for an empty one (a layer without parameters)
        r.layers = {layer_buffers{{bad}, {}}, layer_buffers{}};
        const bool refused = plan_error_text(capture_scope_of<config<impl::eager>>, r).find("training_program::layers[0] declares buffer 'G' (a parameter)") !=
                             std::string::npos;
        CHECK(refused == (bad.bytes != 0));
    }
}

TEST_CASE("a branch stage on lane 0 is refused at plan time (the runner could not fork onto the step's stream)") {
    fake::model m;
    training_program p = m.program("DD", false, 1);
    auto& list = p.microbatches[0];
    list[1].lane = 1; // a side-lane segment ...
    list[2].layer = list[1].layer;
    list[2].lane = 1;
    list[2].branch = false;
    stage branch = m.make("layer0.copy", list[1].layer, stage_kind::other, {}, &m.buffers[50]);
    branch.branch = true; // ... holding a branch on lane 0
    list.insert(list.begin() + 2, branch);
    const std::string text = plan_error_text(capture_scope_of<config<impl::eager>>, p);
    CHECK_MESSAGE(text.find("capscope plan rule P3: branch stage 'layer0.copy' is on lane 0, the step's stream") != std::string::npos, text);
    p.microbatches[0][2].lane = 2;
    CHECK(plan_error_text(capture_scope_of<config<impl::eager>>, p) == "(no error)");
}

TEST_CASE("P8: a stage that passes host values to its kernels at launch stays out of graphs") {
    fake::model m;
    auto p = m.program("DD", false, 1);
    p.microbatches[0][4].passes_host_values = true; // layer1.mlp: dropout with a seed passed by value
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {}}, p) ==
          "capscope plan rule P8: stage 'layer1.mlp' passes host values to its kernels at launch (a graph would freeze them), yet "
          "impl local captures whole layers, this one included -- fix: declare it updated_in_graph (it is captured, recorded again "
          "before each replay and its nodes updated in the graph), or keep the values in device memory and have the kernels read "
          "them there (as the example model's AdamW and dropout seed do), then drop passes_host_values; or name the regions to "
          "capture instead of the whole layer (modules<>), leaving out mlp");
    CHECK(plan_for<config<impl::lazy_per_layer, modules<capture::attention>>>(p).graph_count == 4);
    // Declared updated in the graph, it is captured with its layer, under every capturing impl.
    p.microbatches[0][4].updated_in_graph = true;
    CHECK(plan_for<config<impl::lazy_per_layer>>(p).graph_count == 4);
    CHECK(plan_for<config<impl::whole_iteration, no_nan_check>>(p).graph_count == 1);
    // The plan's text and DOT say which stages are updated.
    const training_plan local = make_training_plan({graph_impl::lazy_per_layer, {}}, 1, p);
    CHECK(to_text(local, p).find("layer1.mlp [updated before each replay]") != std::string::npos);
    const training_plan whole = make_training_plan({graph_impl::whole_iteration, {}}, 1, p);
    CHECK(to_text(whole, p).find("layer1.mlp (microbatch 0 forward): a child graph, recorded again and updated before each replay") != std::string::npos);
    CHECK(to_dot(whole, p).find("[updated before each replay: 'layer1.mlp']") != std::string::npos);
}

TEST_CASE("P21: a stage updated in the graph cannot be guarded, or sit in a trainer's marks") {
    fake::model m;
    auto p = m.program("D", false, 1);
    char flag[4] = {};
    p.microbatches[0][2].passes_host_values = p.microbatches[0][2].updated_in_graph = true;
    p.microbatches[0][2].guard = run_if({"all_finite", flag, sizeof flag});
    p.microbatches[0][1].outputs.push_back({"all_finite", flag, sizeof flag}); // attention writes the flag
    const std::string text = plan_error_text({graph_impl::whole_iteration, {}}, p);
    CHECK(text.find("capscope plan rule P21: stage 'layer0.mlp' is updated in the graph before each replay and runs only while a flag holds") == 0);
    p.microbatches[0][2].guard = {};
    CHECK(plan_for<config<impl::whole_iteration, no_nan_check>>(p).graph_count == 1);
}

TEST_CASE("a stage in no capture region gets a fix it can follow") {
    fake::model m;
    auto p = m.program("D", false, 1);
    p.microbatches[0][2].captured_by = region_set{};
    p.microbatches[0][2].synchronizes_with_host = true;
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {}}, p) ==
          "capscope plan rule P1: stage 'layer0.mlp' synchronizes with the host, yet impl local captures whole layers, this one "
          "included -- fix: a stage in no capture region is captured only with whole layers (modules<>): name the regions to capture "
          "(modules<...>) so that this stage is left out, or move it out of the layer (layer -1)");
}

TEST_CASE("lanes: side-lane stages form segments of their own, and the plan derives and shows the waits") {
    fake::model m;
    auto p = m.program("DD", false, 1);
    // A gradient reduction per layer on lane 1 (backward only). As a stage of layer L it writes
    // layer L's gradients in its backward, and the optimizer touches every layer's.
    for (int layer : {0, 1}) {
        stage reduce = p.microbatches[0][std::size_t(2 + 2 * layer)];
        reduce.name = "layer" + std::to_string(layer) + ".reduce";
        reduce.forward = {};
        reduce.outputs = {};
        reduce.lane = 1;
        p.microbatches[0].insert(p.microbatches[0].begin() + 1 + 2 * layer + (layer ? 1 : 0), reduce);
    }
    p.layers = {{{}, {{"layer0.grads", &m.buffers[20], 1}}}, {{}, {{"layer1.grads", &m.buffers[21], 1}}}};
    const auto plan = plan_for<config<impl::lazy_per_layer, modules<>>>(p);
    CHECK(summary(plan, p, phase::forward, 0) == "e:embedding g0:layer0.attention+layer0.mlp g1:layer1.attention+layer1.mlp e:head");
    CHECK(summary(plan, p, phase::backward, 0) ==
          "e:head g2:layer1.mlp+layer1.attention g3:layer1.reduce g4:layer0.mlp+layer0.attention g5:layer0.reduce e:embedding");
    // One wait: the optimizer, for the last reduction (the lane runs them in order). Layer 0's
    // backward touches other gradients than layer 1's reduction, so it overlaps it.
    REQUIRE(plan.waits.size() == 1);
    const plan_segment& last = plan.segments.back();
    CHECK(last.waits.count == 1);
    CHECK(stage_of(p, plan.calls[std::size_t(plan.waits[0].producer)]).name == "layer0.reduce");
    CHECK(plan.waits[0].buffer == "layer0.grads");
    const std::string text = to_text(plan, p);
    CHECK(text.find("graph g3     layer1.reduce  [side lane 1]") != std::string::npos);
    CHECK(text.find("graph g4     layer0.mlp layer0.attention\n") != std::string::npos);
    CHECK(text.find("eager        optimizer  [waits for layer0.reduce on lane 1]") != std::string::npos);
    CHECK_FALSE(find_order_violation(plan, p));
    // The whole iteration keeps them in its one graph (lanes fork and join inside it).
    CHECK(plan_for<config<impl::whole_iteration, no_nan_check>>(p).segments.size() == 1);
}

namespace {
// A trainer that is not shaped like Megatron: a residual-MLP block with two parts of its own.
using branch_part = stage_decl<kind<"branch">, regions<region<"branch">>>;
using gate_part = stage_decl<kind<"gate">, regions<region<"gate">>>;
using residual = layer_schema<"residual", branch_part, gate_part>;
struct noop {
    void run(stream_handle) {}
};
} // namespace

TEST_CASE("open vocabulary: a trainer's own stage kinds and regions, captured by name, checked against its schema") {
    noop n;
    const stream_fn f = stream_fn::of<&noop::run>(&n);
    training_program p;
    p.microbatches.emplace_back();
    for (int l = 0; l < 2; ++l) {
        p.microbatches[0].push_back(branch_part::make("block" + std::to_string(l) + ".branch", l, f, f));
        p.microbatches[0].push_back(gate_part::make("block" + std::to_string(l) + ".gate", l, f, f));
    }
    CHECK(p.microbatches[0][0].kind == stage_kind_id{"branch"});
    CHECK(p.microbatches[0][0].captured_by == region_set{"branch"});
    using branch_only = config<impl::lazy_per_layer, capture_regions<"branch">>;
    static_assert(branch_only::regions == region_set{"branch"});
    const auto plan = plan_for<branch_only>(p);
    CHECK(summary(plan, p, phase::forward, 0) == "g0:block0.branch e:block0.gate g1:block1.branch e:block1.gate");
    CHECK(to_text(plan, p).find("regions {branch}") != std::string::npos);
    // Whole layers when no region is named; Megatron's modules match none of these stages.
    CHECK(plan_for<config<impl::lazy_per_layer, modules<>>>(p).graph_count == 4);
    CHECK_NOTHROW(match_schemas(layer_schemas<residual>{}, p));
    // The predefined kinds are names too, and Megatron's modules are region names.
    CHECK(stage_kind_id{stage_kind::moe_router} == stage_kind_id{"moe_router"});
    CHECK(region_set{capture_module::attention, capture_module::moe} == region_set{"moe", "attn"});
    // A stage tagged with a region its schema does not declare: the mismatch names both.
    p.microbatches[0][3].captured_by = {"branch"};
    try {
        match_schemas(layer_schemas<residual>{}, p);
        FAIL("no mismatch");
    } catch (const schema_mismatch& e) {
        CHECK(std::string(e.what()).find("block1.gate: gate {branch}") != std::string::npos);
        CHECK(std::string(e.what()).find("schema 'residual' has the same stages, but declares block1.gate as gate {gate}") !=
              std::string::npos);
    }
}

TEST_CASE("P9: named regions that match no stage are an error, not a plan that runs eagerly for ever") {
    fake::model m;
    const auto p = m.program("DD", false, 1);
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {"branch"}}, p) ==
          "capscope plan rule P9: modules {branch} match no stage of the program, so impl local would capture nothing; its layer "
          "stages are in the regions {attn, mlp} -- fix: name regions the stages are in (a trainer's own with capture_regions<...>), "
          "or none (modules<>) to capture whole layers");
    CHECK(plan_error_text({graph_impl::ahead_of_time_per_layer, {capture_module::mamba}}, p).find("capscope plan rule P9:") == 0);
    CHECK(plan_error_text({graph_impl::lazy_per_layer, {capture_module::mlp}}, p) == "(no error)");
    CHECK(plan_error_text({graph_impl::eager, {"branch"}}, p) == "(no error)"); // nothing is captured anyway
}

TEST_CASE("P10: the config's model facts must be the program's") {
    fake::model m;
    const auto p = m.program("DEMDEM", false, 1);
    auto error = [&](const runtime_config& c) {
        try {
            check_model_facts(c, p.microbatches[0]);
        } catch (const plan_error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    using two_layers = config<impl::lazy_per_layer, model<layers<2>>>;
    CHECK(error(two_layers::normalized) ==
          "capscope plan rule P10: the config states 2 layers (layers<2>), and its rules were checked for them, but the program has "
          "6 layers -- fix: make layers<N> the model's layer count, or leave it out");
    CHECK(error(config<impl::lazy_per_layer, model<layers<6>, experts<4>, moe_pattern<0, 1, 0, 0, 1, 0>>>::normalized) == "(no error)");
    CHECK(error(config<impl::lazy_per_layer, model<experts<4>, moe_pattern<0, 1, 0>>>::normalized).find("moe_pattern<...> lists 3 layers") !=
          std::string::npos);
    CHECK(error(config<impl::lazy_per_layer, model<experts<4>, moe_pattern<0, 1, 1, 0, 1, 0>>>::normalized)
              .find("layer 2 is an MoE layer in the config's MoE layout, but the program's has no MoE stage") != std::string::npos);
    CHECK(error(config<impl::lazy_per_layer, model<experts<4>, moe_every<2>>>::normalized)
              .find("layer 0 is an MoE layer in the config's MoE layout") != std::string::npos);
    CHECK(error(config<impl::lazy_per_layer>::normalized) == "(no error)"); // no facts stated: nothing to contradict
}

template <class F>
concept held_inline = requires(F f) { stream_fn::from(f); };

TEST_CASE("stream_fn::from holds a small lambda itself: copied with the stage, compared by its captures") {
    int calls = 0;
    int* counter = &calls;
    const stream_fn a = stream_fn::from([counter, step = 3](stream_handle) { *counter += step; });
    stream_fn copy = a; // a stage list is copied and moved; the callable goes with it
    copy(nullptr);
    a(nullptr);
    CHECK(calls == 6);
    CHECK(copy == a);
    const stream_fn other = stream_fn::from([counter, step = 4](stream_handle) { *counter += step; });
    CHECK_FALSE(other == a); // another capture: another binding
    // What would need an allocation, or a destructor, is not taken: a lambda owning a string.
    const auto owning = [s = std::string("owns")](stream_handle) { (void)s; };
    static_assert(!held_inline<decltype(owning)>);
    static_assert(held_inline<decltype([counter](stream_handle) { ++*counter; })>);
}
