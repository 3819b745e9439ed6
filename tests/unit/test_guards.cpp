// Guarded stages in the plan (capscope/plan/guards.hpp): the conditional nodes it shows, and
// rules P14 (guarded work the host must act in), P15 (the flag written before it is read, and by
// a WHILE body) and P16 (one guarded run, one segment and one lane).
#include "fake_program.hpp"
#include "plan_helpers.hpp"

#include <capscope/capscope.hpp>
#include <capscope/plan/print.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace capscope;
using namespace plan_helpers;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

//! The fake model "DD" with a NaN check in step_end that writes `all_finite`, and the optimizer
//! guarded by it.
struct guarded_model {
    fake::model m;
    int flags[2] = {0, 0};
    tensor_ref all_finite{"all_finite", &flags[0], sizeof(int)};
    training_program p = m.program("DD", false, 1);

    guarded_model() {
        stage check = m.make("check_finite", -1, stage_kind::other, {}, &m.buffers[61]);
        check.backward = {};
        check.outputs.push_back(all_finite);
        p.step_end.insert(p.step_end.begin(), check);
        p.step_end.back().guard = run_if(all_finite); // the optimizer
    }
};

} // namespace

TEST_CASE("a guarded optimizer is a conditional node inside the graph, and a host read in an eager island") {
    guarded_model g;
    const training_plan whole = make_training_plan({graph_impl::whole_iteration, {}}, 0, g.p);
    const std::string whole_text = to_text(whole, g.p);
    CHECK(contains(whole_text, "    optimizer: in conditional node IF 'all_finite'\n"));
    CHECK(contains(to_dot(whole, g.p), "[conditional nodes: IF 'all_finite']"));

    const training_plan local = make_training_plan({graph_impl::lazy_per_layer, {}}, 0, g.p);
    const std::string local_text = to_text(local, g.p);
    CHECK(contains(local_text, "eager        check_finite IF 'all_finite' { optimizer }  [guards read on the host: IF 'all_finite']\n"));
    // As a failed capture names a segment's stages: comma-separated, the braces still read right.
    const plan_segment& step_end = local.segments.back();
    CHECK(capscope::detail::segment_stages(local, g.p, step_end, ", ") == "check_finite, IF 'all_finite' { optimizer }");
    CHECK(capscope::detail::segment_stages(local, g.p, step_end, "\\n") == "check_finite\\nIF 'all_finite' {\\noptimizer\\n}");

    // The guard reads the flag: a writer on a side lane is waited for, as any other reader's would be.
    g.p.step_end.front().lane = 2;
    const training_plan laned = make_training_plan({graph_impl::whole_iteration, {}}, 0, g.p);
    CHECK(contains(to_text(laned, g.p), "    optimizer: waits for check_finite on lane 2\n"));
}

TEST_CASE("P15: a guard whose flag no earlier call writes is refused, and so is a WHILE body that never writes it") {
    guarded_model g;
    g.p.step_end.front().outputs.pop_back(); // the check no longer declares that it writes the flag
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, g.p) ==
          "capscope plan rule P15: stage 'optimizer' is guarded by IF 'all_finite', which no earlier call of the step writes, so the "
          "condition would be whatever a previous step left -- fix: write the flag in a stage that runs before 'optimizer' and "
          "declare it in that stage's outputs");

    guarded_model w;
    w.p.step_end.back().guard = run_while(w.all_finite);
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, w.p) ==
          "capscope plan rule P15: the stages guarded by WHILE 'all_finite' (from 'optimizer') never write it, so the loop would never "
          "end once it holds -- fix: have the last guarded stage write the flag (and declare it in its outputs)");
    w.p.step_end.back().outputs.push_back(w.all_finite); // the body writes it: a loop that can end
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, w.p) == "(no error)");

    guarded_model n;
    n.p.step_end.back().guard = run_if(tensor_ref{"nothing", nullptr, 0});
    CHECK(contains(plan_error_text({graph_impl::eager, {}}, n.p), "capscope plan rule P15: the guard of stage 'optimizer' has no flag"));
}

TEST_CASE("P14: a guarded stage may not need the host, under any impl") {
    guarded_model g;
    g.p.step_end.back().synchronizes_with_host = true;
    CHECK(plan_error_text({graph_impl::eager, {}}, g.p) ==
          "capscope plan rule P14: guarded stage 'optimizer' synchronizes with the host, but guarded stages run inside a conditional "
          "graph node (IF 'all_finite') when captured, where the host cannot act -- fix: keep the guarded work on the device (values "
          "in device memory, shapes fixed), or move the host work out of the guarded stages");
}

TEST_CASE("P16: one guarded run is one conditional node: one segment, one lane") {
    guarded_model g;
    // layer0.mlp and layer1.attention under one guard: per-layer graphs split them.
    auto& list = g.p.microbatches[0];
    stage check = g.m.make("check", -1, stage_kind::other, {}, &g.m.buffers[62]);
    check.outputs.push_back(g.all_finite);
    list.insert(list.begin() + 1, check);
    list[3].guard = run_if(g.all_finite); // layer0.mlp
    list[4].guard = run_if(g.all_finite); // layer1.attention
    CHECK(contains(plan_error_text({graph_impl::lazy_per_layer, {}}, g.p),
                   "capscope plan rule P16: the stages guarded by IF 'all_finite' from 'layer0.mlp' to 'layer1.attention' fall in two segments"));
    CHECK(plan_error_text({graph_impl::whole_iteration, {}}, g.p) == "(no error)"); // one graph: one node
    // A training plan keeps its eager segments per layer (offload places its copies by them), so
    // an eager run across layers is refused too.
    CHECK(contains(plan_error_text({graph_impl::eager, {}}, g.p), "capscope plan rule P16"));

    guarded_model l;
    stage second = l.p.step_end.back();
    second.name = "optimizer.second";
    second.lane = 3;
    l.p.step_end.push_back(second);
    CHECK(contains(plan_error_text({graph_impl::whole_iteration, {}}, l.p),
                   "capscope plan rule P16: the stages guarded by IF 'all_finite' run on lanes 0 ('optimizer') and 3 ('optimizer.second')"));
}

TEST_CASE("inference plans check guarded stages too: a decode loop's flag is written in the bucket's own forward") {
    fake::model m;
    int flags[2] = {0, 0};
    training_program t = m.program("D", false, 2);
    for (int b = 0; b < 2; ++b) {
        auto& list = t.microbatches[std::size_t(b)];
        const tensor_ref again{"again", &flags[b], sizeof(int)};
        list[2].guard = run_while(again); // layer0.mlp: the loop's body, which writes the flag
        list[2].outputs.push_back(again);
        list[1].outputs.push_back(again); // layer0.attention starts it
    }
    inference_program p;
    p.buckets = t.microbatches;
    p.bucket_sizes = {1, 4};
    const inference_plan block = make_inference_plan(inference_scope::per_block, {}, bucket_list{1, 4}, p);
    CHECK(contains(to_text(block, p), "WHILE 'again' {"));

    p.buckets[1][1].outputs.pop_back(); // bucket 4's loop is started by nothing in its forward
    try {
        make_inference_plan(inference_scope::per_block, {}, bucket_list{1, 4}, p);
        FAIL("no error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P15");
    }
}

TEST_CASE("an inference forward's guarded run across layers: one eager segment, or one node under scope block; P16 per layer") {
    fake::model m;
    int flag = 0;
    const tensor_ref again{"again", &flag, sizeof(int)};
    training_program t = m.program("DD", false, 1);
    auto& list = t.microbatches[0]; // embedding, layer0.attention, layer0.mlp, layer1.attention, layer1.mlp, head
    list[1].outputs.push_back(again);
    for (std::size_t i = 2; i <= 4; ++i) list[i].guard = run_while(again); // layer0.mlp to layer1.mlp
    list[4].outputs.push_back(again);
    inference_program p;
    p.buckets = {list};
    p.bucket_sizes = {1};
    const inference_plan eager = make_inference_plan(inference_scope::eager, {}, bucket_list{1}, p);
    // embedding, layer0 + layer1 (joined where the run crosses them; 4 segments without), head
    CHECK(eager.segments_per_bucket == 3);
    const inference_plan block = make_inference_plan(inference_scope::per_block, {}, bucket_list{1}, p);
    CHECK(contains(to_text(block, p), "WHILE 'again' { layer0.mlp, layer1.attention, layer1.mlp }"));
    // The DOT shows the node, a stage a line, and says where the flag is read.
    const std::string dot = to_dot(block, p);
    CHECK(contains(dot, "label=\"inference scope block, buckets {1}: 1 graph per bucket (bucket 1 shown)\""));
    CHECK(contains(dot, "s0 [label=\"g0\\nembedding\\nlayer0.attention\\nWHILE 'again' {\\nlayer0.mlp\\nlayer1.attention\\nlayer1.mlp\\n}\\nhead"
                        "\\n[conditional nodes: WHILE 'again']\", style=\"filled,bold\""));
    CHECK(contains(to_dot(eager, p), "[guards read on the host: WHILE 'again']\", style=dashed];\n  s0 -> s1;"));
    try {
        make_inference_plan(inference_scope::per_layer, {}, bucket_list{1}, p);
        FAIL("no error");
    } catch (const plan_error& e) {
        CHECK(e.rule() == "P16");
        CHECK(contains(e.what(), "inference::per_block"));
    }
}

TEST_CASE("a guarded stage's forward and backward, side by side in a whole-step segment, are two runs (two nodes)") {
    guarded_model g;
    g.p.step_begin.front().outputs.push_back(g.all_finite); // written before the microbatch
    auto& list = g.p.microbatches[0];
    list.back().guard = run_if(g.all_finite); // the head: its forward call and its backward call are adjacent
    const training_plan whole = make_training_plan({graph_impl::whole_iteration, {}}, 0, g.p);
    const std::string stages = capscope::detail::segment_stages(whole, g.p, whole.segments.front(), " ");
    CHECK(contains(stages, "IF 'all_finite' { head } IF 'all_finite' { head }"));
    CHECK(contains(capscope::detail::guard_list(whole, g.p, whole.segments.front()), "IF 'all_finite', IF 'all_finite', IF 'all_finite'"));
}
