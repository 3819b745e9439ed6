// The marks of a loop-first trainer made into a training_program (capscope/plan/recorded_program.hpp):
// names and regions by default, backward marks joined to their forwards in reverse order, and an
// order no declared program has refused, naming the region.

#include <capscope/plan.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using namespace capscope;

namespace {
std::string error_of(auto&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}
} // namespace

TEST_CASE("a recorded step: default names and regions, backward marks joined in reverse, a backward-only region in its place") {
    program_recorder r;
    char buffers[8] = {};
    r.mark_step_level({.kind = stage_kind_id("zero_grads"), .buffers_declared = true});
    r.begin_microbatch();
    r.mark(phase::forward, {.kind = stage_kind::embedding, .writes = {{"x0", buffers, 1}}});
    for (int l = 0; l < 2; ++l) {
        r.mark(phase::forward, {.layer = l, .kind = stage_kind::attention, .buffers_declared = true});
        r.mark(phase::forward, {.layer = l, .kind = stage_kind_id("block"), .buffers_declared = true});
    }
    for (int l = 1; l >= 0; --l) {
        r.mark(phase::backward, {.layer = l, .kind = stage_kind_id("block"), .reads = {{"dx", buffers + 1, 1}}});
        r.mark(phase::backward, {.layer = l, .kind = stage_kind_id("reduce"), .writes = {{"g", buffers + 2, 1}}}); // no forward
        r.mark(phase::backward, {.layer = l, .kind = stage_kind::attention, .buffers_declared = true});
    }
    r.mark_step_level({.kind = stage_kind::optimizer, .name = "adamw", .buffers_declared = true});
    const training_program p = r.finish();
    REQUIRE(p.microbatches.size() == 1);
    std::string order;
    for (const stage& s : p.microbatches[0]) order += s.name + (s.forward ? "" : "(backward only)") + (s.backward ? "" : "(forward only)") + " ";
    CHECK(order == "embedding(forward only) layer0.attention layer0.reduce(backward only) layer0.block layer1.attention "
                   "layer1.reduce(backward only) layer1.block ");
    CHECK(p.microbatches[0][1].captured_by == region_set{"attn"}); // Megatron's module for its kinds
    CHECK(p.microbatches[0][3].captured_by == region_set{"block"}); // the kind's own name for a trainer's
    CHECK(p.microbatches[0][0].captured_by.empty());                // the model's ends are in no region
    CHECK(p.microbatches[0][3].backward_inputs.size() == 1);
    CHECK(p.microbatches[0][2].backward_outputs.size() == 1);
    CHECK(p.step_begin.at(0).name == "zero_grads");
    CHECK(p.step_end.at(0).name == "adamw");
    // The plan of the recorded program is a plan like any other.
    const training_plan plan = make_training_plan({graph_impl::lazy_per_layer, {}}, 1, p);
    CHECK(plan.graph_count == 4);
    // Its functions are slots: called outside the trainer's own call, they say so.
    CHECK(error_of([&] { p.microbatches[0][1].forward(nullptr); }).find("was called while the trainer's code was not in it") != std::string::npos);
}

TEST_CASE("an order no declared program has is refused, naming the region") {
    auto backwards_in_order = [] {
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark(phase::forward, {.layer = 1, .kind = stage_kind_id("block")});
        r.mark(phase::backward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark(phase::backward, {.layer = 1, .kind = stage_kind_id("block")});
        (void)r.finish();
    };
    CHECK(error_of(backwards_in_order).find("backward region 'layer1.block' comes after a backward region whose forward came before its own") !=
          std::string::npos);
    auto twice = [] {
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
        (void)r.finish();
    };
    CHECK(error_of(twice).find("marks forward region 'layer0.block' twice") != std::string::npos);
    auto outside = [] {
        program_recorder r;
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
    };
    CHECK(error_of(outside).find("outside a microbatch") != std::string::npos);
    auto forward_after_backward = [] {
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark(phase::backward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark(phase::forward, {.layer = 1, .kind = stage_kind_id("block")});
    };
    CHECK(error_of(forward_after_backward).find("forward region 'layer1.block' came after a backward region") != std::string::npos);
    auto other_layer = [] {
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block"), .name = "b"});
        r.mark(phase::backward, {.layer = 1, .kind = stage_kind_id("block"), .name = "b"});
        (void)r.finish();
    };
    CHECK(error_of(other_layer).find("differs from its forward in layer") != std::string::npos);
    auto updated_forward_only = [] { // the first difference is named: here a fact
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = -1, .kind = stage_kind_id("input"), .updated_in_graph = true});
        r.mark(phase::backward, {.layer = -1, .kind = stage_kind_id("input")});
        (void)r.finish();
    };
    CHECK(error_of(updated_forward_only).find("backward region 'input' differs from its forward in updated_in_graph") != std::string::npos);
    auto microbatch_after_end = [] {
        program_recorder r;
        r.begin_microbatch();
        r.mark(phase::forward, {.layer = 0, .kind = stage_kind_id("block")});
        r.mark_step_level({.kind = stage_kind::optimizer});
        r.begin_microbatch();
    };
    CHECK(error_of(microbatch_after_end).find("a microbatch began after step-level work") != std::string::npos);
}
