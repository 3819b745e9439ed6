#pragma once
//! @file
//! `program_recorder`: the marked regions of one step (capscope/stage/marked_region.hpp), in the
//! order a trainer's own loops made them, turned into the `training_program` a declared trainer
//! would build. Everything downstream (rules, plan, derived stream order, verifier, hooks,
//! offload) then works on it as on a declared one. Host-only.
//!
//! A step is: step-level marks (before the first microbatch: `step_begin`), then per microbatch
//! its forward marks and its backward marks, then step-level marks again (`step_end`). A stage's
//! backward is the backward mark with its name; the backward marks must come in the reverse
//! order of their forwards, as a declared program runs them. A backward mark with no forward (a
//! gradient reduction) becomes a backward-only stage where that order puts it.
//!
//! Each recorded stage's function is a *slot*: the in-place runner points it at the callable the
//! trainer passes when its code reaches the mark, for the length of that call. The slot belongs to
//! the stage's name and pass, so microbatches bound alike share one (and one graph, where their
//! declared buffers agree, as declared stages do).

#include <capscope/plan/plan_error.hpp>
#include <capscope/plan/segment.hpp>
#include <capscope/stage/marked_region.hpp>
#include <capscope/stage/program.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace capscope {

namespace detail {

//! A recorded stage's function: the trainer's callable of the moment (none between its calls).
struct region_slot {
    std::string name;
    const void* callable = nullptr;
    void (*invoke)(const void*, stream_handle) = nullptr;

    static void call(region_slot* slot, stream_handle s) {
        if (!slot->invoke)
            throw std::logic_error("capscope: the recorded region '" + slot->name +
                                   "' was called while the trainer's code was not in it (its callable exists only during the "
                                   "trainer's own call) -- fix: run a recorded program with in_place_runner, not a runner of its own");
        slot->invoke(slot->callable, s);
    }
};

//! What a recorded program points to: its slots, and the names its views need to outlive the marks.
struct recorded_storage {
    std::deque<region_slot> slots;
    std::deque<std::string> names;

    std::string_view keep(std::string_view s) {
        for (const std::string& n : names)
            if (n == s) return n;
        return names.emplace_back(s);
    }
};

inline std::string default_region_name(const marked_region& m) {
    const std::string kind(m.kind.name);
    return m.layer >= 0 ? "layer" + std::to_string(m.layer) + "." + kind : kind;
}

//! The capture region of a kind when a mark names none: Megatron's module for its kinds (the
//! model's ends and the step-level work are in none), the kind's own name for a trainer's kind.
inline region_set default_regions(stage_kind_id kind) {
    const stage_kind_id predefined[] = {stage_kind::attention, stage_kind::mlp, stage_kind::moe_router, stage_kind::moe_preprocess,
                                        stage_kind::moe_experts, stage_kind::mamba};
    const std::string_view module[] = {"attn", "mlp", "moe_router", "moe_preprocess", "moe", "mamba"};
    for (std::size_t i = 0; i < std::size(predefined); ++i)
        if (kind == predefined[i]) return region_set{module[i]};
    for (stage_kind k : {stage_kind::embedding, stage_kind::head, stage_kind::optimizer, stage_kind::other})
        if (kind == stage_kind_id(k)) return {};
    return region_set{kind.name};
}

} // namespace detail

class program_recorder {
public:
    program_recorder() : storage_(std::make_shared<detail::recorded_storage>()) {}

    //! The next microbatch begins (its forward marks, then its backward marks).
    void begin_microbatch() {
        if (after_microbatches_)
            throw std::invalid_argument("capscope: a microbatch began after step-level work that follows the microbatches -- fix: "
                                        "mark work between microbatches inside one (forward or backward), or before the first");
        ++microbatch_;
        lists_.push_back({});
        in_backward_ = false;
    }
    //! A step-level mark: `step_begin` before the first microbatch, `step_end` after.
    void mark_step_level(const marked_region& m) {
        if (microbatch_ >= 0) after_microbatches_ = true;
        stage s = make(m);
        s.forward = slot_fn(step_key(s.name));
        (microbatch_ < 0 ? step_begin_ : step_end_).push_back(std::move(s));
    }
    //! A mark of the current microbatch's forward or backward.
    void mark(phase pass, const marked_region& m) {
        if (microbatch_ < 0 || after_microbatches_)
            throw std::invalid_argument("capscope: region '" + name_of(m) + "' was marked as a " + std::string(phase_name(pass)) +
                                        " outside a microbatch -- fix: call begin_microbatch() (in_place_step::microbatch()) before "
                                        "each microbatch's forward, and mark step-level work with run()");
        if (pass == phase::forward && in_backward_)
            throw std::invalid_argument("capscope: forward region '" + name_of(m) + "' came after a backward region in microbatch " +
                                        std::to_string(microbatch_) + " -- fix: start the next microbatch first (microbatch())");
        in_backward_ = in_backward_ || pass == phase::backward;
        if (pass == phase::backward && (!m.saves.empty() || !m.makes.empty()))
            throw plan_error("P3", name_of(m), "backward region '" + name_of(m) + "' says what it saves or makes, which only a forward does",
                             "name saves and makes on the region's forward mark");
        lists_.back()[pass == phase::forward ? 0 : 1].push_back(make(m));
    }
    //! The step as a program (throws `plan_error` P3 for an order no declared program has).
    training_program finish(std::vector<layer_buffers> layers = {}, layer_buffers outside_layers = {}) {
        training_program p;
        p.step_begin = std::move(step_begin_);
        p.step_end = std::move(step_end_);
        for (std::size_t mb = 0; mb < lists_.size(); ++mb) p.microbatches.push_back(merge(int(mb), lists_[mb][0], lists_[mb][1]));
        p.layers = std::move(layers);
        p.outside_layers = std::move(outside_layers);
        p.keepalive.push_back(storage_);
        return p;
    }

    int microbatch() const noexcept { return microbatch_; }
    //! The slot of a recorded stage's pass ("forward:<name>", "backward:<name>", "begin:<name>",
    //! "end:<name>"), or null: set-up only (a lookup by name).
    detail::region_slot* slot(std::string_view key) const {
        for (detail::region_slot& s : storage_->slots)
            if (s.name == key) return &s;
        return nullptr;
    }

private:
    static std::string name_of(const marked_region& m) { return m.name.empty() ? detail::default_region_name(m) : std::string(m.name); }

    stage make(const marked_region& m) {
        stage s;
        s.name = name_of(m);
        s.layer = m.layer;
        s.kind = stage_kind_id(storage_->keep(m.kind.name));
        region_set regions = m.regions.empty() ? detail::default_regions(m.kind) : m.regions;
        regions.for_each([&](std::string_view r) { s.captured_by.insert(storage_->keep(r)); });
        s.synchronizes_with_host = m.synchronizes_with_host;
        s.shapes_depend_on_data = m.shapes_depend_on_data;
        s.passes_host_values = m.passes_host_values || m.updated_in_graph;
        s.updated_in_graph = m.updated_in_graph;
        s.inputs.assign(m.reads.begin(), m.reads.end());
        s.outputs.assign(m.writes.begin(), m.writes.end());
        s.buffers_declared = m.buffers_declared || !m.reads.empty() || !m.writes.empty();
        s.reads_parameters_of.assign(m.reads_parameters_of.begin(), m.reads_parameters_of.end());
        s.saves.assign(m.saves.begin(), m.saves.end());
        s.makes = m.makes;
        s.guard = m.guard;
        if (m.guard.kind == guard_kind::while_holds)
            throw plan_error("P3", s.name, "region '" + s.name + "' is marked run_while: a loop the trainer's code does not see",
                             "loop in the region's own code, or declare the stage (training_program) where a WHILE node can hold it");
        return s;
    }

    //! One slot per name and pass (and step part), shared by the microbatches.
    std::string step_key(const std::string& name) const { return (microbatch_ < 0 ? "begin:" : "end:") + name; }
    stream_fn slot_fn(const std::string& key) {
        for (detail::region_slot& s : storage_->slots)
            if (s.name == key) return stream_fn::of_function<&detail::region_slot::call>(&s);
        detail::region_slot& s = storage_->slots.emplace_back();
        s.name = key;
        return stream_fn::of_function<&detail::region_slot::call>(&s);
    }

    //! Forward marks in order; each backward mark joins its forward's stage, in reverse order, or
    //! stands alone (backward only) where the reverse order puts it.
    std::vector<stage> merge(int mb, std::vector<stage>& forwards, std::vector<stage>& backwards) {
        std::vector<stage> list;
        for (stage& f : forwards) {
            for (const stage& g : list)
                if (g.name == f.name)
                    throw plan_error("P3", f.name, "microbatch " + std::to_string(mb) + " marks forward region '" + f.name + "' twice",
                                     "give each region of a microbatch its own name (marked_region::name), e.g. with its layer");
            f.forward = slot_fn("forward:" + f.name);
            list.push_back(std::move(f));
        }
        // Walk the list backwards as the backward marks come: each must be found at or before the
        // position of the last, or be new.
        int at = int(list.size()) - 1;
        for (stage& b : backwards) {
            int found = -1;
            for (int i = at; i >= 0; --i)
                if (list[std::size_t(i)].name == b.name) {
                    found = i;
                    break;
                }
            if (found < 0) {
                for (const stage& g : list)
                    if (g.name == b.name)
                        throw plan_error("P3", b.name,
                                         "microbatch " + std::to_string(mb) + ": backward region '" + b.name + "' comes " +
                                             (g.backward ? "twice" : "after a backward region whose forward came before its own") +
                                             ", but the backward runs the forward's regions in reverse order",
                                         "mark the backward regions in the reverse order of their forwards, each once");
                b.backward = slot_fn("backward:" + b.name);
                b.backward_inputs = std::move(b.inputs);
                b.backward_outputs = std::move(b.outputs);
                b.inputs.clear();
                b.outputs.clear();
                list.insert(list.begin() + (at + 1), std::move(b));
                continue;
            }
            stage& s = list[std::size_t(found)];
            if (const char* differs = s.layer != b.layer                                 ? "layer"
                                      : !(s.kind == b.kind)                               ? "kind"
                                      : !(s.captured_by == b.captured_by)                 ? "regions"
                                      : s.synchronizes_with_host != b.synchronizes_with_host ? "synchronizes_with_host"
                                      : s.shapes_depend_on_data != b.shapes_depend_on_data   ? "shapes_depend_on_data"
                                      : s.updated_in_graph != b.updated_in_graph             ? "updated_in_graph" // (implies the next)
                                      : s.passes_host_values != b.passes_host_values         ? "passes_host_values"
                                      : !(s.guard == b.guard)                             ? "guard"
                                                                                          : nullptr)
                throw plan_error("P3", b.name, "backward region '" + b.name + "' differs from its forward in " + differs + " (a region's facts are one stage's, both passes)",
                                 "mark a region's backward with the layer, kind, regions, facts and guard of its forward; work whose facts "
                                 "differ goes in a region of its own");
            s.backward = slot_fn("backward:" + b.name);
            s.backward_inputs = std::move(b.inputs);
            s.backward_outputs = std::move(b.outputs);
            s.buffers_declared = s.buffers_declared && b.buffers_declared;
            for (int other : b.reads_parameters_of)
                if (std::find(s.reads_parameters_of.begin(), s.reads_parameters_of.end(), other) == s.reads_parameters_of.end())
                    s.reads_parameters_of.push_back(other);
            at = found - 1;
        }
        return list;
    }

    std::shared_ptr<detail::recorded_storage> storage_;
    std::vector<stage> step_begin_, step_end_;
    std::vector<std::array<std::vector<stage>, 2>> lists_;
    int microbatch_ = -1;
    bool in_backward_ = false, after_microbatches_ = false;
};

} // namespace capscope
