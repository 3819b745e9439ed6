// Hooks on a pipelined chunk's passes (hooks/with_pass_hooks.hpp), on the host: where each phase
// runs in a forward pass, in the recomputed forward and in a backward pass; of_layers; the step
// hooks before and after the optimizer; and what is refused at run time (too few tensors, a lane
// hook with nothing to order). What is refused at compile time (rule H5) is in
// tests/compile_fail/hook_cases.cpp.

#include "fake_program.hpp"

#include <capscope/hooks.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

using namespace capscope;

namespace {
using fake::where;

//! Layers 2 and 3 of a 4-layer dense model: a chunk of a pipeline stage (one list of stages).
//! The stages point into the pipeline and the tensors: neither may be a temporary.
template <class P>
concept pass_hooks_from_kept = requires(const std::vector<stage>& c, const P& p, std::span<const layer_tensors> t) { with_pass_hooks(c, p, t); };
template <class P>
concept pass_hooks_from_temporary_pipeline = requires(const std::vector<stage>& c, std::span<const layer_tensors> t) { with_pass_hooks(c, P{}, t); };
template <class P>
concept pass_hooks_from_temporary_tensors = requires(const std::vector<stage>& c, const P& p) { with_pass_hooks(c, p, std::vector<layer_tensors>{}); };
template <class P>
concept step_hooks_from_kept = requires(const P& p, std::span<const layer_tensors> t, const layer_buffers& o) {
    step_hook_stages(p, step_point::before_optimizer, t, o);
};
template <class P>
concept step_hooks_from_temporary_pipeline = requires(std::span<const layer_tensors> t, const layer_buffers& o) {
    step_hook_stages(P{}, step_point::before_optimizer, t, o);
};
template <class P>
concept step_hooks_from_temporary_tensors = requires(const P& p, const layer_buffers& o) {
    step_hook_stages(p, step_point::before_optimizer, std::vector<layer_tensors>{}, o);
};
using stateless = hook_pipeline<decltype(hook<hook_phase::forward, capturable>("stat", [](forward_context&) {})),
                                decltype(on_step<step_point::before_optimizer, capturable>("clip", [](step_context&) {}))>;
static_assert(pass_hooks_from_kept<stateless> && !pass_hooks_from_temporary_pipeline<stateless> && !pass_hooks_from_temporary_tensors<stateless>);
static_assert(step_hooks_from_kept<stateless> && !step_hooks_from_temporary_pipeline<stateless> && !step_hooks_from_temporary_tensors<stateless>);
// A const pipeline is a pipeline (decltype of a const variable).
static_assert(fits_pipelined_passes<const stateless>);

std::vector<stage> chunk_of(fake::model& m) {
    const training_program p = m.program("DDDD", false, 1);
    std::vector<stage> out;
    for (const stage& s : p.microbatches.front())
        if (s.layer == 2 || s.layer == 3) out.push_back(s);
    return out;
}
} // namespace

TEST_CASE("hooks on a pipelined chunk: forward pass, recomputed forward without the forward hooks, backward pass") {
    fake::model m;
    auto& log = m.log;
    hook_pipeline hooks{
        hook<hook_phase::forward_pre, capturable>("gather", [&log](forward_pre_context& c) { log.push_back(where("gather", c)); }),
        hook<hook_phase::forward, capturable>("stat", [&log](forward_context& c) { log.push_back(where("stat", c)); }),
        hook<hook_phase::backward_pre, capturable>("regather", [&log](backward_pre_context& c) { log.push_back(where("regather", c)); }),
        hook<hook_phase::backward, capturable, of_layers<3>>("scale", [&log](backward_context& c) { log.push_back(where("scale", c)); }),
        on_step<step_point::before_optimizer, capturable>("clip", [&log](step_context& c) { log.push_back("clip " + std::to_string(c.layers().size())); }),
        on_step<step_point::after_optimizer, capturable>("norm", [&log](step_context&) { log.push_back("norm"); }),
    };
    static_assert(fits_pipelined_passes<decltype(hooks)>);
    const layer_tensors tensors[4] = {};
    const std::vector<stage> chunk = chunk_of(m);
    const pass_stages stages = with_pass_hooks(chunk, hooks, tensors);

    run_forward(stages.passes, nullptr);
    CHECK(log == std::vector<std::string>{"gather L2 mb-1", "layer2.attention.fwd", "layer2.mlp.fwd", "stat L2 mb-1",
                                          "gather L3 mb-1", "layer3.attention.fwd", "layer3.mlp.fwd", "stat L3 mb-1"});
    log.clear();
    // A backward pass: its forward recomputed (the gathers again, no statistic), then the backward.
    run_forward(stages.recomputed, nullptr);
    run_backward(stages.passes, nullptr);
    CHECK(log == std::vector<std::string>{"gather L2 mb-1", "layer2.attention.fwd", "layer2.mlp.fwd", "gather L3 mb-1", "layer3.attention.fwd",
                                          "layer3.mlp.fwd", "regather L3 mb-1", "layer3.mlp.bwd", "layer3.attention.bwd", "scale L3 mb-1",
                                          "regather L2 mb-1", "layer2.mlp.bwd", "layer2.attention.bwd"});
    // The chunk's own stages are all there, in order, in both lists.
    for (const auto* list : {&stages.passes, &stages.recomputed}) {
        std::vector<std::string> own;
        for (const stage& s : *list)
            if (!s.added) own.push_back(s.name);
        CHECK(own == std::vector<std::string>{"layer2.attention", "layer2.mlp", "layer3.attention", "layer3.mlp"});
    }

    log.clear();
    const layer_buffers outside;
    run_forward(step_hook_stages(hooks, step_point::before_optimizer, tensors, outside), nullptr);
    run_forward(step_hook_stages(hooks, step_point::after_optimizer, tensors, outside), nullptr);
    CHECK(log == std::vector<std::string>{"clip 4", "norm"});
}

TEST_CASE("hooks on a pipelined chunk: what is refused when the hooks are placed") {
    fake::model m;
    const std::vector<stage> chunk = chunk_of(m);
    hook_pipeline plain{hook<hook_phase::forward, capturable>("stat", [](forward_context&) {})};
    const layer_tensors three[3] = {};
    CHECK_THROWS_WITH_AS(with_pass_hooks(chunk, plain, three), doctest::Contains("one layer_tensors per layer of the whole model"), std::invalid_argument);

    hook_pipeline named{hook<hook_phase::forward, capturable, of_layers<7>>("stat", [](forward_context&) {})};
    const layer_tensors four[4] = {};
    CHECK_THROWS_WITH_AS(with_pass_hooks(chunk, named, four), doctest::Contains("names layer 7"), std::invalid_argument);

    // On a lane, a hook must name what it touches (here no parameters), or nothing could wait for it.
    hook_pipeline laned{hook<hook_phase::forward_pre, capturable, on_lane<1>>("gather", [](forward_pre_context&) {})};
    CHECK_THROWS_WITH_AS(with_pass_hooks(chunk, laned, four), doctest::Contains("name nothing it touches"), std::invalid_argument);
}
