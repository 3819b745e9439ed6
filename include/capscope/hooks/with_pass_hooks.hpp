#pragma once
//! @file
//! Hooks on a pipelined model's passes. A pipeline chunk runs its layers' stages as passes: a
//! forward pass runs the list forwards, a backward pass first recomputes the forward (full
//! recomputation) and then runs the list backwards. `with_pass_hooks` puts a hook pipeline's
//! layer hooks into those lists at the places `with_hooks` gives them in a step
//! (capscope/hooks/with_hooks.hpp), and `step_hook_stages` makes its step hooks, so the hooks run
//! wherever the passes run: eagerly, from a graph per pass, or inside a whole-step graph.
//!
//! - The recomputed forward runs the forward_pre hooks (they bring what the layer reads: a
//!   parameter all-gather) but not the forward hooks, which see each microbatch's output once,
//!   as in a step without a pipeline (a statistic would otherwise count a microbatch twice).
//! - One pass graph serves every microbatch of its slot, and the microbatch is read on the device,
//!   so a hook's `microbatch()` is -1 here.
//! - A hook on a lane (`on_lane<K>`) runs in its place on the pass's stream: a pass is one stream.
//!
//! Rule H5 refuses, at compile time, what a pipelined pass cannot run: a boundary hook (there is
//! no boundary inside a pass, nor inside a whole-step graph; a step hook's step may be one graph),
//! a capture-time hook (the same stages run eagerly too), `last_microbatch_only` (no pass knows it
//! holds the last microbatch), and a warmup hook (no runner's warmup steps). Step hooks see every
//! layer's tensors as given: a pipelined model gives its own layers', the others' empty.

#include <capscope/hooks/with_hooks.hpp>

#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace capscope {

//! A chunk's stages with the hooks: what its passes run.
struct pass_stages {
    std::vector<stage> passes;     //!< a forward pass runs it forwards, a backward pass backwards: every layer hook
    std::vector<stage> recomputed; //!< a backward pass's recomputed forward: without the forward hooks
};

namespace detail {
template <class H>
constexpr bool is_pass_boundary_hook() {
    if constexpr (is_layer_hook<H>) return std::is_same_v<typename H::placement, boundary>;
    else return false;
}
template <class H>
constexpr bool is_step_boundary_hook() {
    if constexpr (is_step_hook<H>) return std::is_same_v<typename H::placement, boundary>;
    else return false;
}
template <class H>
constexpr bool is_pass_capture_time_hook() {
    if constexpr (is_layer_hook<H> || is_step_hook<H>) return std::is_same_v<typename H::placement, capture_time>;
    else return false;
}
template <class H>
constexpr bool is_last_microbatch_hook() {
    if constexpr (is_layer_hook<H>) return H::last_microbatch;
    else return false;
}
template <class H>
constexpr bool is_first_microbatch_hook() {
    if constexpr (is_layer_hook<H>) return H::first_microbatch;
    else return false;
}

template <class... Hooks>
struct checked_pass_hooks {
    static_assert(!(is_pass_boundary_hook<std::remove_cv_t<Hooks>>() || ...),
                  "capscope hook rule H5: a pipelined pass runs eagerly, from its own graph or inside the whole step's graph, so it "
                  "has no boundary where a boundary hook's host work could run -- fix: make the hook capturable (stream work only), "
                  "or do the host work between steps");
    static_assert(!(is_step_boundary_hook<std::remove_cv_t<Hooks>>() || ...),
                  "capscope hook rule H5: a pipelined model's step may be captured whole (full_iteration), and the hooks are set "
                  "before the model knows, so a step hook has no boundary for host work either -- fix: make the step hook "
                  "capturable, or do the host work between steps");
    static_assert(!(is_pass_capture_time_hook<std::remove_cv_t<Hooks>>() || ...),
                  "capscope hook rule H5: a pipelined pass runs the same stages eagerly and captured, so a capture-time hook would "
                  "run at every eager pass and at each capture, and never at a replay -- fix: make the hook capturable, or do its "
                  "work once before the step is captured");
    static_assert(!(is_last_microbatch_hook<std::remove_cv_t<Hooks>>() || ...),
                  "capscope hook rule H5: one pipelined pass graph serves every microbatch of its slot (the microbatch is read on the "
                  "device), so no pass knows it holds the last one -- fix: drop last_microbatch_only (the hook then runs every "
                  "microbatch), or use on_step<step_point::before_optimizer, capturable>, which runs once after every backward "
                  "of this rank's layers");
    static_assert(!(is_first_microbatch_hook<std::remove_cv_t<Hooks>>() || ...),
                  "capscope hook rule H5: one pipelined pass graph serves every microbatch of its slot (the microbatch is read on the "
                  "device), so no pass knows it holds the first one -- fix: drop first_microbatch_only (the hook then runs every "
                  "microbatch)");
    static_assert(!(is_warmup_hook<std::remove_cv_t<Hooks>> || ...),
                  "capscope hook rule H5: a pipelined model has no runner warmup steps to run a warmup hook around -- fix: drop the "
                  "warmup hook and do its work before the first step");
    static constexpr bool value = true;
};

template <class Pipeline>
struct pass_hooks_of {
    static_assert(sizeof(Pipeline) == 0, "capscope hook rule H0: fits_pipelined_passes<P> takes a hook_pipeline<...> -- fix: pass "
                                         "decltype(pipeline)");
    static constexpr bool value = false;
};
template <class... Hooks>
struct pass_hooks_of<hook_pipeline<Hooks...>> : checked_pass_hooks<Hooks...> {};
} // namespace detail

//! Whether every hook of `Pipeline` (a hook_pipeline, const or not) can run in a pipelined pass
//! (rule H5, as a static_assert).
template <class Pipeline>
inline constexpr bool fits_pipelined_passes = detail::pass_hooks_of<std::remove_cvref_t<Pipeline>>::value;

//! The chunk's layer stages `chunk` (one pass of its layers, as `run_forward` runs them) with
//! the layer hooks of `hooks`. `tensors[L]` is layer L's parameters and gradients for the whole
//! model's layers (only the chunk's are read); they and the hooks outlive the stages.
template <class... Hooks>
pass_stages with_pass_hooks(const std::vector<stage>& chunk, const hook_pipeline<Hooks...>& hooks, std::span<const layer_tensors> tensors) {
    static_assert(fits_pipelined_passes<hook_pipeline<Hooks...>>);
    const int layers = detail::layer_count(chunk);
    if (int(tensors.size()) < layers)
        throw std::invalid_argument("capscope::with_pass_hooks: " + std::to_string(tensors.size()) + " layer_tensors, and the chunk has layer " +
                                    std::to_string(layers - 1) + " -- fix: give one layer_tensors per layer of the whole model, in layer order");
    detail::check_named_layers(hooks, int(tensors.size()), std::make_index_sequence<sizeof...(Hooks)>{});
    constexpr unsigned recomputed = detail::all_hook_phases & ~(1u << unsigned(hook_phase::forward));
    return {detail::add_hooks(chunk, hooks, -1, tensors, nullptr), detail::add_hooks(chunk, hooks, -1, tensors, nullptr, recomputed)};
}

//! The step hooks of `hooks` that run at `when` (before or after the optimizer), in declaration
//! order, as stages whose forward runs them: every layer's tensors (`tensors`, as for
//! `with_pass_hooks`) and those outside the layers (`outside`: the embeddings, the head).
template <class... Hooks>
std::vector<stage> step_hook_stages(const hook_pipeline<Hooks...>& hooks, step_point when, std::span<const layer_tensors> tensors,
                                    const layer_buffers& outside) {
    static_assert(fits_pipelined_passes<hook_pipeline<Hooks...>>);
    std::vector<stage> out;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&] {
                using H = std::remove_cv_t<std::tuple_element_t<I, std::tuple<Hooks...>>>;
                if constexpr (detail::is_step_hook<H>)
                    if (H::when == when) out.push_back(detail::step_hook_stage(hooks.template at<I>(), tensors, outside));
            }(),
            ...);
    }(std::make_index_sequence<sizeof...(Hooks)>{});
    return out;
}

//! The stages point into the pipeline and the tensors: temporaries would dangle.
template <class... Hooks>
pass_stages with_pass_hooks(const std::vector<stage>&, hook_pipeline<Hooks...>&&, std::span<const layer_tensors>) = delete;
template <class... Hooks>
pass_stages with_pass_hooks(const std::vector<stage>&, const hook_pipeline<Hooks...>&, std::vector<layer_tensors>&&) = delete;
template <class... Hooks>
std::vector<stage> step_hook_stages(hook_pipeline<Hooks...>&&, step_point, std::span<const layer_tensors>, const layer_buffers&) = delete;
template <class... Hooks>
std::vector<stage> step_hook_stages(const hook_pipeline<Hooks...>&, step_point, std::vector<layer_tensors>&&, const layer_buffers&) = delete;

} // namespace capscope
