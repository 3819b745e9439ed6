// Compile-fail cases of the hook rules (capscope/hooks/): H1 (a hook's callable takes another
// phase's context: a gradient reduction declared forward_pre), H2 (a boundary hook under
// whole_iteration), H4 (a capturable hook that synchronizes with the host), H5 (what a pipelined
// pass cannot run: boundary, capture-time, first- and last-microbatch and warmup hooks), H0 (not a
// hook, two lanes, a boundary hook on a lane, first and last microbatch both, one_layer_ahead on a
// hook that is not a layer's pre hook); and
// of a sharding policy under per-layer graphs (F1, F2: its gather buffers must be static); and of
// a composition (C1-C3: each part named once). As
// is, every valid twin must compile; with -DCASE_<ID>[__variant] the first error must read
// "capscope hook rule <ID>:" and say the fix (check.py).
// The configuration and the hook pipelines, not the whole of capscope.hpp.
#include <capscope/config.hpp>
#include <capscope/compose.hpp>
#include <capscope/hooks.hpp>
#include <capscope/parallel/sharding.hpp>

using namespace capscope;

constexpr auto reduce_gradients = [](backward_context& c) { (void)c.gradients(); };
constexpr auto gather_parameters = [](forward_pre_context& c) { (void)c.parameters(); };
constexpr auto log_step = [](forward_context&) {};

// H1: the gradients are complete only after the layer's backward.
constexpr auto reduce = hook<hook_phase::backward, capturable>("grad all-reduce", reduce_gradients);
#ifdef CASE_H1
constexpr auto reduce_too_early = hook<hook_phase::forward_pre, capturable>("grad all-reduce", reduce_gradients);
#endif
constexpr auto gather = hook<hook_phase::forward_pre, capturable>("param all-gather", gather_parameters);
#ifdef CASE_H1__backward_pre
constexpr auto gather_late = hook<hook_phase::backward_pre, capturable>("param all-gather", gather_parameters);
#endif
#ifdef CASE_H1__no_context
constexpr auto wrong_signature = hook<hook_phase::forward, boundary>("log", [](int) {});
#endif

// H4: a capturable hook is inside the graph; a host synchronization belongs at the boundary.
constexpr auto log_boundary = hook<hook_phase::forward, boundary, synchronizes_with_host>("log", log_step);
#ifdef CASE_H4
constexpr auto log_captured = hook<hook_phase::forward, capturable, synchronizes_with_host>("log", log_step);
#endif

// H2: the whole step is one graph; there is no boundary for host work.
using per_layer = config<impl::ahead_of_time_per_layer>;
using whole_step = config<impl::whole_iteration, no_nan_check>;
static_assert(hooks_fit<per_layer, hook_pipeline<decltype(reduce), decltype(log_boundary)>>);
static_assert(hooks_fit<whole_step, hook_pipeline<decltype(reduce), decltype(gather)>>);
#ifdef CASE_H2
static_assert(hooks_fit<whole_step, hook_pipeline<decltype(reduce), decltype(log_boundary)>>);
#endif
// ... a step hook's host work too (a loss log between steps):
constexpr auto log_loss = on_step<step_point::after_optimizer, boundary>("loss log", [](step_context&) {});
constexpr auto clip = on_step<step_point::before_optimizer, capturable>("clip", [](step_context&) {});
static_assert(hooks_fit<per_layer, hook_pipeline<decltype(clip), decltype(log_loss)>>);
static_assert(hooks_fit<whole_step, hook_pipeline<decltype(clip)>>);
#ifdef CASE_H2__step
static_assert(hooks_fit<whole_step, hook_pipeline<decltype(clip), decltype(log_loss)>>);
#endif
#ifdef CASE_H1__step
constexpr auto clip_layer = on_step<step_point::before_optimizer, capturable>("clip", reduce_gradients);
#endif
#ifdef CASE_H0__step_region
constexpr auto clip_region = on_step<step_point::before_optimizer, capturable, of_region<capture::mlp>>("clip", [](step_context&) {});
#endif
// ... and without the static_assert: a composition checks what it is given.
inline training_program composed_per_layer() {
    return composition<per_layer>(training_program{}).hooks(hook_pipeline<decltype(reduce), decltype(log_boundary)>{reduce, log_boundary}, {}).program();
}
#ifdef CASE_H2__composition
inline training_program composed_whole_step() {
    return composition<whole_step>(training_program{}).hooks(hook_pipeline<decltype(reduce), decltype(log_boundary)>{reduce, log_boundary}, {}).program();
}
#endif
// H5: a pipelined model's passes run eagerly, from a graph per pass and slot, or inside the whole
// step's graph, and one pass graph serves every microbatch: capturable hooks that run every
// microbatch, and capturable step hooks (hooks/with_pass_hooks.hpp).
constexpr auto stat = hook<hook_phase::forward, capturable, on_lane<1>>("stat", log_step);
constexpr auto gather_ahead_pass = hook<hook_phase::forward_pre, capturable, one_layer_ahead>("param all-gather", gather_parameters);
static_assert(fits_pipelined_passes<hook_pipeline<decltype(reduce), decltype(gather), decltype(stat), decltype(gather_ahead_pass), decltype(clip)>>);
#ifdef CASE_H5
static_assert(fits_pipelined_passes<hook_pipeline<decltype(reduce), decltype(log_boundary)>>);
#endif
#ifdef CASE_H5__step_boundary
static_assert(fits_pipelined_passes<hook_pipeline<decltype(clip), decltype(log_loss)>>);
#endif
#ifdef CASE_H5__capture_time
constexpr auto once = hook<hook_phase::forward_pre, capture_time>("register", gather_parameters);
static_assert(fits_pipelined_passes<hook_pipeline<decltype(reduce), decltype(once)>>);
#endif
#ifdef CASE_H5__last_microbatch
constexpr auto reduce_last = hook<hook_phase::backward, capturable, last_microbatch_only>("grad all-reduce", reduce_gradients);
static_assert(fits_pipelined_passes<hook_pipeline<decltype(reduce_last)>>);
#endif
#ifdef CASE_H5__first_microbatch
constexpr auto gather_first = hook<hook_phase::forward_pre, capturable, first_microbatch_only>("param all-gather", gather_parameters);
static_assert(fits_pipelined_passes<hook_pipeline<decltype(gather_first)>>);
#endif
#ifdef CASE_H0__fits_pipelined_passes
static_assert(fits_pipelined_passes<decltype(reduce)>); // a hook, not a pipeline of them
#endif
#ifdef CASE_H5__warmup
constexpr auto warm = on_warmup<warmup_point::before>("warm", [](warmup_context&) {});
static_assert(fits_pipelined_passes<hook_pipeline<decltype(reduce), decltype(warm)>>);
#endif
// C1-C3: each part of a composition is named once (its type holds it).
struct no_store {
    training_program with_offload(const training_program& p, const capture_scope&) const { return p; }
};
inline training_program composed_once(const no_store& store) {
    return composition<per_layer>(training_program{}).hooks(hook_pipeline<decltype(reduce), decltype(log_boundary)>{reduce, log_boundary}, {}).offload(store).sharded<sharded<>>().program();
}
#ifdef CASE_C1
inline training_program hooks_twice() {
    return composition<per_layer>(training_program{}).hooks(hook_pipeline<decltype(reduce), decltype(log_boundary)>{reduce, log_boundary}, {}).hooks(hook_pipeline<decltype(gather), decltype(log_boundary)>{gather, log_boundary}, {}).program();
}
#endif
#ifdef CASE_C2
inline training_program offload_twice(const no_store& store) {
    return composition<per_layer>(training_program{}).offload(store).offload(store).program();
}
#endif
#ifdef CASE_C3
inline training_program sharded_twice() {
    return composition<per_layer>(training_program{}).sharded<sharded<>>().sharded<sharded<>>().program();
}
#endif

// H0: a pipeline holds hooks, not bare callables.
[[maybe_unused]] constexpr hook_pipeline<decltype(reduce), decltype(gather)> pipeline{reduce, gather};
#ifdef CASE_H0
using bare = hook_pipeline<decltype(reduce_gradients)>;
constexpr bare not_hooks{};
#endif
// H0: a hook's options: one lane (a side stream), and none for host work at the boundary.
[[maybe_unused]] constexpr auto reduce_on_lane = hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("grad all-reduce", reduce_gradients);
#ifdef CASE_H0__two_lanes
constexpr auto reduce_on_two = hook<hook_phase::backward, capturable, on_lane<1>, on_lane<2>>("grad all-reduce", reduce_gradients);
#endif
// H0: a hook runs in the first microbatch or in the last (a gather kept for the step; a reduction).
[[maybe_unused]] constexpr auto gather_once = hook<hook_phase::forward_pre, capturable, on_lane<1>, first_microbatch_only>("param all-gather", gather_parameters);
#ifdef CASE_H0__first_and_last
constexpr auto gather_first_and_last = hook<hook_phase::forward_pre, capturable, first_microbatch_only, last_microbatch_only>("param all-gather", gather_parameters);
#endif
#ifdef CASE_H0__boundary_on_lane
constexpr auto log_on_lane = hook<hook_phase::forward, boundary, on_lane<1>>("log", log_step);
#endif
// H0: one_layer_ahead prefetches what a layer reads: a pre hook of whole layers, stream work.
[[maybe_unused]] constexpr auto gather_ahead = hook<hook_phase::forward_pre, capturable, on_lane<1>, one_layer_ahead>("param all-gather", gather_parameters);
#ifdef CASE_H0__ahead_after_the_layer
constexpr auto reduce_ahead = hook<hook_phase::backward, capturable, on_lane<1>, one_layer_ahead>("grad all-reduce", reduce_gradients);
#endif
#ifdef CASE_H0__ahead_of_a_region
constexpr auto gather_region_ahead = hook<hook_phase::forward_pre, capturable, one_layer_ahead, of_region<capture::mlp>>("param all-gather", gather_parameters);
#endif
// H0: what decides a hook's collective calls, for the plan's fingerprint, has one signature.
struct bucketed {
    void operator()(backward_context&) const {}
    std::string collective_calls(int) const { return "buckets of 40 MiB"; }
};
[[maybe_unused]] constexpr auto reduce_bucketed = hook<hook_phase::backward, capturable>("grad all-reduce", bucketed{});
#ifdef CASE_H0__collective_calls_signature
struct unhashed {
    void operator()(backward_context&) const {}
    std::string collective_calls() const { return "buckets of 40 MiB"; } // no layer: the fingerprint would miss it
};
constexpr auto reduce_unhashed = hook<hook_phase::backward, capturable>("grad all-reduce", unhashed{});
#endif
#ifdef CASE_H0__ahead_at_the_boundary
constexpr auto gather_host_ahead = hook<hook_phase::forward_pre, boundary, one_layer_ahead>("param all-gather", gather_parameters);
#endif
#ifdef CASE_H0__ahead_on_some_layers
constexpr auto gather_some_ahead = hook<hook_phase::forward_pre, capturable, one_layer_ahead, of_layers<1, 2>>("param all-gather", gather_parameters);
#endif

// F1, F2: per-layer graphs replay on fixed addresses, so gathered parameters need static buffers.
static_assert(sharding_fits<per_layer, sharded<static_double_buffer, persistent_buffer>>);
static_assert(sharding_fits<whole_step, sharded<dynamic_gather_buffer, dynamic_buffer>>); // one graph, gathers inside it
static_assert(sharding_fits<config<impl::eager>, sharded<dynamic_gather_buffer, dynamic_buffer>>);
#ifdef CASE_F1__sharded
static_assert(sharding_fits<per_layer, sharded<dynamic_gather_buffer, persistent_buffer>>);
#endif
#ifdef CASE_F2__sharded
static_assert(sharding_fits<config<impl::lazy_per_layer>, sharded<static_double_buffer, dynamic_buffer>>);
#endif

int main() {}
