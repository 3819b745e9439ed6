#pragma once
//! @file
//! Hooks become stages of the training program, so every impl runs them where their type says,
//! eager or captured, with no code of their own in the runner:
//! - a capturable hook is a stage in its layer's capture region, next to the stages it hooks:
//!   captured into the same graph at its position, and run at that position when eager;
//! - a capture-time hook is a stage in its layer's region that runs only while its segment is
//!   captured (`stage::capture_only`): once per capture, never eagerly, never replayed;
//! - a boundary hook is a stage that synchronizes with the host, outside every layer, so it is
//!   an eager island between graphs: host work around the replay of its layer's segment. A
//!   boundary hook of a region in the middle of a fused segment splits the segment there (the
//!   plan shows the two graphs and the island between them).
//! Positions, for the stages the hook belongs to (its layer's, or those of its region):
//! forward_pre before the first (forward only), forward after the last (forward only),
//! backward_pre after the last (backward only: the backward runs the list in reverse, so it runs
//! before their backward), backward before the first (after their backward). Hooks of one phase
//! and site run in declaration order; a region's hooks nest inside the layer's (a layer's
//! forward_pre runs before its attention region's, the region's forward hook before the layer's).
//! The stage names are "layerN.hook.<name>"; `of_layers<...>` keeps a hook to the layers it names.
//! A `one_layer_ahead` pre hook of layer L sits at those positions of the layer the pass runs
//! before L (a prefetch; by list order), after the layer's own hooks of its phase there (a
//! region's pre hooks still nest inside, after it), as a segment of its own; the pass's first
//! layer runs its own call, then the next layer's (when the list holds the layers in index order;
//! otherwise the order of the two may swap, which only costs a wait). Layer L's parameters
//! must not share memory with that layer's (the prefetch would overwrite what it has yet to read).
//! A step hook (`on_step`) is a stage of `step_end`, "step.hook.<name>": before the optimizer
//! it writes every layer's gradients and reads the parameters, after it reads both (a step
//! hook that writes after the optimizer must run on the step's stream). Given the capture
//! scope, a capture-time hook goes next to the stages of its span that the scope captures;
//! plan rule P13 refuses one left in an eager segment, where it would never run. A hook on a side lane (`on_lane<K>`) is a stage on
//! that lane. What a hook touches follows from its phase, as its context gives it: a pre hook
//! (forward_pre, backward_pre) writes its layer's parameters (it brings what the layer reads: an
//! all-gather), a forward hook reads them, a backward hook reads and writes the layer's gradients
//! (a reduction) and reads its parameters: what a hook declares covers all that its context lets
//! it touch, so a hook body that reads more than its kind usually does is still ordered. The plan orders the other stages against that
//! (capscope/plan/stream_order.hpp): the layer's stages wait for its pre hook's lane, the
//! optimizer (which touches every layer's parameters and gradients) for every backward hook.

#include <capscope/hooks/hook_pipeline.hpp>
#include <capscope/plan/access.hpp>
#include <capscope/plan/capture_region.hpp>
#include <capscope/stage/program.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace capscope {

namespace detail {

//! Layer `layer`'s stage of hook `h`. A one_layer_ahead stage sits among the stages of the layer
//! before it but stays layer `layer`'s: a segment of its own on its lane, so that at the pass's
//! first layer, which runs its own gather and then the next one's, the layer waits for its own.
template <class Hook>
stage hook_stage(const Hook& h, int layer, int microbatch, const layer_tensors* tensors, const region_set& regions) {
    constexpr hook_phase p = Hook::phase;
    constexpr bool host = std::is_same_v<typename Hook::placement, boundary>;
    constexpr bool at_capture = std::is_same_v<typename Hook::placement, capture_time>;
    stage s;
    s.name = "layer" + std::to_string(layer) + ".hook." + std::string(h.name());
    s.kind = stage_kind_id("hook");
    s.layer = host ? -1 : layer; // a boundary hook is outside the layers, so no capture contains it
    s.captured_by = host ? region_set{} : regions;
    s.synchronizes_with_host = host;
    s.capture_only = at_capture;
    s.last_microbatch_only = Hook::last_microbatch;
    s.first_microbatch_only = Hook::first_microbatch;
    s.collective_calls = h.collective_calls(layer);
    s.added = true;
    const stream_fn fn = stream_fn::from([hook = &h, tensors, layer, microbatch](stream_handle stream) {
        hook_context<p> context(stream, layer, microbatch, *tensors);
        (*hook)(context);
    });
    (pass_of(p) == phase::forward ? s.forward : s.backward) = fn;
    // What it touches, by phase (see the file comment).
    const std::vector<tensor_ref> parameters(tensors->parameters.begin(), tensors->parameters.end());
    switch (p) {
    case hook_phase::forward_pre: s.outputs = parameters; break;
    case hook_phase::backward_pre: s.backward_outputs = parameters; break;
    case hook_phase::forward: s.inputs = parameters; break;
    case hook_phase::backward: // its context gives the parameters too (a trust ratio, weight decay): read, declared as read
        s.backward_inputs = parameters;
        s.backward_outputs.assign(tensors->gradients.begin(), tensors->gradients.end());
        break;
    }
    s.buffers_declared = true;
    if (Hook::lane != 0 && s.inputs.empty() && s.outputs.empty() && s.backward_outputs.empty())
        throw std::invalid_argument("capscope::with_hooks: hook '" + std::string(h.name()) + "' runs on lane " + std::to_string(Hook::lane) +
                                    " but layer " + std::to_string(layer) + "'s layer_tensors name nothing it touches" +
                                    (p == hook_phase::backward ? " (no gradients)" : " (no parameters)") +
                                    ", so nothing could be ordered after it -- fix: give with_hooks the layer's parameters (what a pre "
                                    "hook brings and the layer reads) and gradients (what a backward hook reduces)");
    return s;
}

//! The [first, last] stages of `list` a hook of `regions` belongs to in `layer`, or {-1, -1}: the
//! trainer's own stages (what capscope added, activation copies, is not what a hook hooks, so
//! the order of with_hooks and with_offload does not matter).
//! With `captured` (a capture-time hook, when the composition knows the capture scope), only the
//! stages that scope captures count: the hook runs while one of their graphs is captured. When
//! none of its stages is captured it keeps its plain span, where plan rule P13 refuses it.
inline std::pair<int, int> hook_span(const std::vector<stage>& list, int layer, const region_set& regions, const capture_scope* captured = nullptr) {
    int first = -1, last = -1;
    for (int i = 0; i < int(list.size()); ++i) {
        const stage& s = list[std::size_t(i)];
        if (s.added || s.layer != layer || (!regions.empty() && !s.captured_by.intersects(regions))) continue;
        if (captured && !(s.capturable() && inside_captured_region(*captured, s.facts()))) continue;
        if (first < 0) first = i;
        last = i;
    }
    if (captured && first < 0) return hook_span(list, layer, regions);
    return {first, last};
}

//! Hook stages next to one stage, each list in execution order.
struct hook_slot {
    std::vector<stage> forward_before, forward_after, backward_before, backward_after;
};

//! The layer the pass runs just before `own` (the span of a layer's stages): the layer of the
//! nearest stage of the trainer's before it in the list (the forward), or after it (the backward
//! runs the list backwards); -1 when the layer comes first in its pass.
inline int layer_before_in_pass(const std::vector<stage>& list, std::pair<int, int> own, bool forward) {
    const int step = forward ? -1 : 1;
    for (int i = (forward ? own.first : own.second) + step; i >= 0 && i < int(list.size()); i += step)
        if (!list[std::size_t(i)].added && list[std::size_t(i)].layer >= 0) return list[std::size_t(i)].layer;
    return -1;
}

//! Where a one_layer_ahead hook of `layer` runs: beside the layer its pass runs before it, which
//! must not read what the hook overwrites (layer L's parameters sharing memory with L - 1's: a
//! prefetch into them would change L - 1's before it reads them); the pass's first layer keeps
//! its own.
template <class H>
int ahead_site(const H& h, const std::vector<stage>& list, std::pair<int, int> own, int layer, std::span<const layer_tensors> tensors) {
    const int site = layer_before_in_pass(list, own, H::phase == hook_phase::forward_pre);
    if (site < 0 || site == layer) return layer;
    for (const tensor_ref& mine : tensors[std::size_t(layer)].parameters)
        for (const tensor_ref& theirs : tensors[std::size_t(site)].parameters)
            if (overlaps(mine, theirs))
                throw std::invalid_argument("capscope::with_hooks: one_layer_ahead hook '" + std::string(h.name()) + "' would bring layer " +
                                            std::to_string(layer) + "'s parameters ('" + mine.name + "') while layer " + std::to_string(site) +
                                            " runs, but they share memory with layer " + std::to_string(site) + "'s ('" + theirs.name +
                                            "'), which that layer has yet to read -- fix: gather consecutive layers into different "
                                            "buffers (a double buffer: layer L into half L % 2), or drop one_layer_ahead");
    return site;
}

//! Adds the hooks that run in `round` 0 (pre phases of the whole layer, post phases of a region)
//! or 1 (the others): a region's hooks nest inside the layer's, as a submodule's inside its
//! parent's. With `ahead`, only the one_layer_ahead hooks, without, only the others: at one
//! place the prefetches come after the layer's own hooks of their phase there. Their layers are
//! taken in the order the pass runs them (a backward_pre hook's from the last), so at the pass's
//! first layer its own call runs before the next layer's. Only the hooks of the phases in
//! `phases` (bit 1 << phase) are added.
template <class Pipeline, std::size_t... I>
void add_round(std::vector<hook_slot>& slots, const std::vector<stage>& list, const Pipeline& hooks, int microbatch,
               std::span<const layer_tensors> tensors, int round, bool ahead, const capture_scope* scope, unsigned phases, std::index_sequence<I...>) {
    const int layers = int(tensors.size());
    for (int k = 0; k < layers; ++k) {
        (
            [&] {
                using H = std::remove_cv_t<std::tuple_element_t<I, typename Pipeline::hook_types>>;
                if constexpr (is_layer_hook<H>) {
                    constexpr bool pre = H::phase == hook_phase::forward_pre || H::phase == hook_phase::backward_pre;
                    const int layer = H::ahead && H::phase == hook_phase::backward_pre ? layers - 1 - k : k;
                    if (!(phases & (1u << unsigned(H::phase)))) return;
                    if (H::ahead != ahead || (pre == H::regions.empty()) != (round == 0) || !H::on_layer(layer)) return;
                    const capture_scope* captured = std::is_same_v<typename H::placement, capture_time> ? scope : nullptr;
                    std::pair<int, int> span = hook_span(list, layer, H::regions, captured);
                    if (span.first < 0) return; // the layer has no stages here
                    if constexpr (H::ahead) {
                        const int site = ahead_site(hooks.template at<I>(), list, span, layer, tensors);
                        if (site != layer) span = hook_span(list, site, H::regions, captured);
                    }
                    const bool at_first = H::phase == hook_phase::forward_pre || H::phase == hook_phase::backward;
                    const int at = at_first ? span.first : span.second;
                    const stage& next_to = list[std::size_t(at)];
                    stage s = hook_stage(hooks.template at<I>(), layer, microbatch, &tensors[std::size_t(layer)], next_to.captured_by);
                    s.lane = H::lane ? H::lane : next_to.lane;
                    hook_slot& slot = slots[std::size_t(at)];
                    const bool forward = pass_of(H::phase) == phase::forward;
                    (at_first ? (forward ? slot.forward_before : slot.backward_before)
                              : (forward ? slot.forward_after : slot.backward_after))
                        .push_back(std::move(s));
                }
            }(),
            ...);
    }
}

//! Every phase, for add_hooks' `phases`.
inline constexpr unsigned all_hook_phases = 0xfu;

template <class Pipeline>
std::vector<stage> add_hooks(const std::vector<stage>& list, const Pipeline& hooks, int microbatch, std::span<const layer_tensors> tensors,
                             const capture_scope* scope, unsigned phases = all_hook_phases) {
    std::vector<hook_slot> slots(list.size());
    for (int round = 0; round < 2; ++round)
        for (const bool ahead : {false, true})
            add_round(slots, list, hooks, microbatch, tensors, round, ahead, scope, phases, std::make_index_sequence<Pipeline::size>{});
    // List order: forward passes run the list forwards, backward passes backwards.
    std::vector<stage> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        hook_slot& slot = slots[i];
        for (auto it = slot.backward_before.rbegin(); it != slot.backward_before.rend(); ++it) out.push_back(std::move(*it));
        for (stage& s : slot.forward_before) out.push_back(std::move(s));
        out.push_back(list[i]);
        for (stage& s : slot.forward_after) out.push_back(std::move(s));
        for (auto it = slot.backward_after.rbegin(); it != slot.backward_after.rend(); ++it) out.push_back(std::move(*it));
    }
    return out;
}

template <class Hook>
stage step_hook_stage(const Hook& h, std::span<const layer_tensors> tensors, const layer_buffers& outside) {
    constexpr bool host = std::is_same_v<typename Hook::placement, boundary>;
    stage s;
    s.name = "step.hook." + std::string(h.name());
    s.kind = stage_kind_id("hook");
    s.synchronizes_with_host = host;
    s.capture_only = std::is_same_v<typename Hook::placement, capture_time>;
    s.lane = Hook::lane;
    s.added = true;
    s.forward = stream_fn::from([hook = &h, tensors](stream_handle stream) {
        step_context context(stream, tensors);
        (*hook)(context);
    });
    // Before the optimizer it may change the gradients (clipping) and reads the parameters; after
    // it, it reads both (a log, a norm).
    auto& grads = Hook::when == step_point::before_optimizer ? s.outputs : s.inputs;
    for (const layer_tensors& t : tensors) {
        s.inputs.insert(s.inputs.end(), t.parameters.begin(), t.parameters.end());
        grads.insert(grads.end(), t.gradients.begin(), t.gradients.end());
    }
    // The model's tensors outside its layers too (a global norm reads the embedding's gradients).
    s.inputs.insert(s.inputs.end(), outside.parameters.begin(), outside.parameters.end());
    grads.insert(grads.end(), outside.gradients.begin(), outside.gradients.end());
    s.buffers_declared = true;
    return s;
}

//! Adds the pipeline's step hooks to `step_end`: before its stages, or after them.
template <class Pipeline, std::size_t... I>
std::vector<stage> add_step_hooks(const std::vector<stage>& step_end, const Pipeline& hooks, std::span<const layer_tensors> tensors,
                                  const layer_buffers& outside, std::index_sequence<I...>) {
    std::vector<stage> before, after;
    (
        [&] {
            using H = std::remove_cv_t<std::tuple_element_t<I, typename Pipeline::hook_types>>;
            if constexpr (is_step_hook<H>)
                (H::when == step_point::before_optimizer ? before : after).push_back(step_hook_stage(hooks.template at<I>(), tensors, outside));
        }(),
        ...);
    before.insert(before.end(), step_end.begin(), step_end.end());
    before.insert(before.end(), std::make_move_iterator(after.begin()), std::make_move_iterator(after.end()));
    return before;
}

//! A hook's of_layers<...> naming a layer the program lacks.
template <class Pipeline, std::size_t... I>
void check_named_layers(const Pipeline& hooks, int layers, std::index_sequence<I...>) {
    (
        [&] {
            using H = std::remove_cv_t<std::tuple_element_t<I, typename Pipeline::hook_types>>;
            if constexpr (is_layer_hook<H>)
                if (H::last_named_layer >= layers)
                    throw std::invalid_argument("capscope::with_hooks: hook '" + std::string(hooks.template at<I>().name()) + "' names layer " +
                                                std::to_string(H::last_named_layer) + " in of_layers<...>, but the program has " +
                                                std::to_string(layers) + " layers -- fix: name layers 0.." + std::to_string(layers - 1));
        }(),
        ...);
}

//! The number of layers in `list`: one more than its largest layer index.
inline int layer_count(const std::vector<stage>& list) {
    int n = 0;
    for (const stage& s : list) n = std::max(n, s.layer + 1);
    return n;
}

} // namespace detail

//! The program with the pipeline's hooks as stages, for layers 0..tensors.size()-1
//! (`tensors[L]` is layer L's parameters and gradients, kept alive by the trainer, as are
//! the hooks; one entry per layer of the program). Warmup hooks are not stages: they travel with
//! the program (`training_program::warmup`), and the runner runs them around its warmup steps.
//! The program also learns what each layer's stages touch (`training_program::layers`), so the
//! plan can order them against the hooks on lanes.
//! With `scope` (the runner's `capture_scope_of<Config>`; `composition` passes it), capture-time
//! hooks go next to the stages that scope captures; without, next to their layer's (or region's)
//! first or last stage, where P13 refuses one that a graph does not hold.
template <class... Hooks>
training_program with_hooks(const training_program& program, const hook_pipeline<Hooks...>& hooks,
                            std::span<const layer_tensors> tensors, const capture_scope* scope = nullptr) {
    const int layers = program.microbatches.empty() ? 0 : detail::layer_count(program.microbatches.front());
    // A pipeline of step and warmup hooks only touches no layer's tensors: it may be given none.
    constexpr bool layer_hooks = (detail::is_layer_hook<std::remove_cv_t<Hooks>> || ...);
    if (int(tensors.size()) != layers && (layer_hooks || !tensors.empty()))
        throw std::invalid_argument("capscope::with_hooks: " + std::to_string(tensors.size()) + " layer_tensors for a program of " +
                                    std::to_string(layers) + " layers -- fix: give one layer_tensors per layer, in layer order");
    detail::check_named_layers(hooks, layers, std::make_index_sequence<sizeof...(Hooks)>{});
    training_program out = program; // what the hooks leave alone comes along: the rerun, what is kept alive
    out.step_end = detail::add_step_hooks(program.step_end, hooks, tensors, program.outside_layers, std::make_index_sequence<sizeof...(Hooks)>{});
    out.microbatches.clear();
    for (std::size_t mb = 0; mb < program.microbatches.size(); ++mb)
        out.microbatches.push_back(detail::add_hooks(program.microbatches[mb], hooks, int(mb), tensors, scope));
    if constexpr ((detail::is_warmup_hook<std::remove_cv_t<Hooks>> || ...)) {
        if (out.warmup.run)
            throw std::invalid_argument("capscope::with_hooks: the program already has the warmup hooks of another pipeline -- fix: put "
                                        "every warmup hook in one pipeline");
        out.warmup = warmup_work_of(hooks);
    }
    // out.layers: an earlier with_hooks' tensors stay, as its hooks touch them
    out.layers.resize(std::max(out.layers.size(), tensors.size()));
    auto add_missing = [](std::vector<tensor_ref>& to, std::span<const tensor_ref> from) {
        for (const tensor_ref& t : from)
            if (std::find(to.begin(), to.end(), t) == to.end()) to.push_back(t);
    };
    for (std::size_t l = 0; l < tensors.size(); ++l) {
        add_missing(out.layers[l].parameters, tensors[l].parameters);
        add_missing(out.layers[l].gradients, tensors[l].gradients);
    }
    return out;
}

//! The stages point into the pipeline and the tensors: temporaries would dangle. Name them in a
//! `composition` (capscope/compose/composition.hpp), which keeps its own copies, or keep them alive.
template <class... Hooks>
training_program with_hooks(const training_program&, hook_pipeline<Hooks...>&&, std::span<const layer_tensors>,
                            const capture_scope* = nullptr) = delete;
template <class... Hooks>
training_program with_hooks(const training_program&, const hook_pipeline<Hooks...>&, std::vector<layer_tensors>&&,
                            const capture_scope* = nullptr) = delete;

} // namespace capscope
