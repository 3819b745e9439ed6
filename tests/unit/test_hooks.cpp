// Hook pipelines (capscope/hooks/): phase and placement by type, declaration order within a
// phase, region sites, and what each phase's context exposes.
#include <capscope/capscope.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace capscope;

namespace {
template <class Context>
constexpr bool exposes_gradients = requires(Context& c) { c.gradients(); };
} // namespace

// Only a backward hook's context has the gradients: the FSDP bug of Megatron PR #4232 (a
// gradient reduction that ran in the forward graph) cannot be written.
static_assert(exposes_gradients<backward_context>);
static_assert(!exposes_gradients<forward_pre_context>);
static_assert(!exposes_gradients<forward_context>);
static_assert(!exposes_gradients<backward_pre_context>);
static_assert(pass_of(hook_phase::backward_pre) == phase::backward && pass_of(hook_phase::forward) == phase::forward);

TEST_CASE("hooks of one phase and placement run in declaration order; others do not run") {
    std::vector<std::string> calls;
    hook_pipeline pipeline{
        hook<hook_phase::forward_pre, capturable>("gather", [&](forward_pre_context& c) { calls.push_back("gather " + std::to_string(c.layer())); }),
        hook<hook_phase::backward, capturable>("reduce", [&](backward_context& c) {
            calls.push_back("reduce " + std::to_string(c.gradients().size()));
        }),
        hook<hook_phase::forward_pre, boundary>("log", [&](forward_pre_context&) { calls.push_back("log"); }),
        hook<hook_phase::forward_pre, capturable>("prefetch", [&](forward_pre_context& c) { calls.push_back("prefetch " + std::to_string(c.microbatch())); }),
        on_warmup<warmup_point::before>("register buffers", [&](warmup_context&) { calls.push_back("warmup before"); }),
    };
    static_assert(decltype(pipeline)::size == 5);
    static_assert(decltype(pipeline)::count<hook_phase::forward_pre, capturable> == 2);
    static_assert(decltype(pipeline)::count<hook_phase::backward, capturable> == 1);
    static_assert(decltype(pipeline)::count<hook_phase::backward, boundary> == 0);
    static_assert(decltype(pipeline)::has_boundary_hooks);

    const tensor_ref params[] = {{"w", nullptr, 16}};
    const tensor_ref grads[] = {{"dw", nullptr, 16}, {"db", nullptr, 4}};
    const layer_tensors tensors{params, grads};
    forward_pre_context fwd(nullptr, 3, 1, tensors);
    pipeline.run<hook_phase::forward_pre, capturable>(fwd);
    CHECK(calls == std::vector<std::string>{"gather 3", "prefetch 1"});
    pipeline.run<hook_phase::forward_pre, boundary>(fwd);
    backward_context bwd(nullptr, 3, 1, tensors);
    pipeline.run<hook_phase::backward, capturable>(bwd);
    warmup_context warm{nullptr};
    pipeline.run_warmup<warmup_point::before>(warm);
    pipeline.run_warmup<warmup_point::after>(warm);
    CHECK(calls == std::vector<std::string>{"gather 3", "prefetch 1", "log", "reduce 2", "warmup before"});
}

TEST_CASE("a hook of one capture region runs at that region's site, a layer hook at the layer's") {
    std::vector<std::string> calls;
    hook_pipeline pipeline{
        hook<hook_phase::forward, capturable, of_region<capture::attention>>("after attn", [&](forward_context&) { calls.push_back("attn"); }),
        hook<hook_phase::forward, capturable, of_region<region<"mixer">>>("after mixer", [&](forward_context&) { calls.push_back("mixer"); }),
        hook<hook_phase::forward, capturable>("after layer", [&](forward_context&) { calls.push_back("layer"); }),
    };
    const layer_tensors none{};
    forward_context c(nullptr, 0, 0, none);
    pipeline.run<hook_phase::forward, capturable>(c, hook_site{region_set{capture_module::attention}});
    pipeline.run<hook_phase::forward, capturable>(c, hook_site{region_set{std::string_view("mixer")}});
    pipeline.run<hook_phase::forward, capturable>(c, hook_site::whole_layer());
    CHECK(calls == std::vector<std::string>{"attn", "mixer", "layer"});
}

TEST_CASE("the plan's view: every layer hook with its phase, placement and regions, in declaration order") {
    hook_pipeline pipeline{
        hook<hook_phase::backward, capturable>("grad reduce-scatter", [](backward_context&) {}),
        hook<hook_phase::forward_pre, boundary, synchronizes_with_host, of_region<capture::mlp>>("host log", [](forward_pre_context&) {}),
        on_warmup<warmup_point::after>("pin buffers", [](warmup_context&) {}),
    };
    std::vector<std::string> seen;
    pipeline.describe([&](std::string_view name, hook_phase p, std::string_view placement, const region_set& regions) {
        seen.push_back(std::string(name) + " " + std::string(hook_phase_name(p)) + " " + std::string(placement) + " " +
                       std::to_string(regions.size()));
    });
    CHECK(seen == std::vector<std::string>{"grad reduce-scatter backward capturable 0", "host log forward_pre boundary 1"});
}

TEST_CASE("a pipeline fits a per-layer config whatever its hooks; whole_iteration takes capturable hooks") {
    hook_pipeline pipeline{hook<hook_phase::backward, capturable>("reduce", [](backward_context&) {})};
    static_assert(hooks_fit<config<impl::whole_iteration, no_nan_check>, decltype(pipeline)>);
    static_assert(hooks_fit<config<impl::lazy_per_layer>, decltype(pipeline)>);
    CHECK(decltype(pipeline)::has_boundary_hooks == false);
}

TEST_CASE("a generic-lambda hook takes the phase its declaration names; the empty pipeline compiles") {
    int seen = 0;
    // Its body calls gradients(), which only a backward context has: tried as forward_pre first,
    // it would not compile.
    const auto reduce = hook<hook_phase::backward, capturable>("reduce", [&seen](auto& c) { seen += int(c.gradients().size()); });
    static_assert(decltype(reduce)::phase == hook_phase::backward);
    const tensor_ref grads[2] = {};
    const layer_tensors tensors{{}, {grads, 2}};
    backward_context c(nullptr, 0, 0, tensors);
    reduce(c);
    CHECK(seen == 2);
    constexpr hook_pipeline<> none;
    static_assert(decltype(none)::size == 0);
}

// The stages with_hooks makes point into the pipeline and the layers' tensors, so temporaries
// are refused at compile time (a composition keeps copies of both).
namespace {
template <class P>
concept hooks_from_temporary_pipeline = requires(const training_program& p, std::span<const layer_tensors> t) { with_hooks(p, P{}, t); };
template <class P>
concept hooks_from_temporary_tensors = requires(const training_program& p, const P& pipeline) { with_hooks(p, pipeline, std::vector<layer_tensors>{}); };
template <class P>
concept hooks_from_kept = requires(const training_program& p, const P& pipeline, std::span<const layer_tensors> t) { with_hooks(p, pipeline, t); };
} // namespace
static_assert(hooks_from_kept<hook_pipeline<>>);
static_assert(!hooks_from_temporary_pipeline<hook_pipeline<>>);
static_assert(!hooks_from_temporary_tensors<hook_pipeline<>>);
