#pragma once
//! @file
//! The stage seam. A trainer describes each layer as a fixed sequence of stages: a forward and
//! a backward `stream_fn`, bound once to device buffers whose addresses never change, tagged
//! with the capture modules whose region contains the stage and with the facts that keep a
//! stage out of a graph. The plan (`capscope/plan/`) reads the facts; the runner calls the
//! functions.
//!
//! Streams: a stage's work is ordered on the stream it is given. It may fork work onto streams
//! of its own and join it back with events before it returns (list them in `forks_to`, so a
//! failed capture can be ended on each). Work that must outlive the stage, overlapping later
//! stages (a gradient reduction), goes on a *lane*: the runner's side stream `lane`, forked
//! from the step's stream before the stage. Nothing waits for a lane by hand: every stage
//! declares what its functions read and write (capscope/plan/access.hpp), and the plan makes
//! each later call that touches what lane work writes, or writes what it reads, wait for exactly
//! that work (capscope/plan/stream_order.hpp); the step's stream waits for every lane before
//! `step()` returns. A *branch* stage runs on its lane too, but stays in the segment of the
//! stages around it: forked inside that segment's graph and joined at its end (an activation
//! copy captured with the layer that writes the tensor).

#include <capscope/vocabulary/region.hpp>
#include <capscope/stage/saved_tensor.hpp>
#include <capscope/detail/scope_label.hpp>
#include <capscope/stage/stage_guard.hpp>
#include <capscope/stage/stage_kind.hpp>
#include <capscope/stage/stream_fn.hpp>
#include <capscope/stage/tensor_ref.hpp>
#include <capscope/vocabulary/capture_module.hpp>

#include <span>
#include <string>
#include <vector>

namespace capscope {

//! What the plan needs to know of a stage: a literal type, so a plan can also be computed
//! from a compile-time layer schema (`capscope/stage/schema.hpp`).
struct stage_facts {
    stage_kind_id kind = stage_kind::other;
    int layer = -1; //!< -1: outside the layers (embedding, head, step-level work)
    //! The capture regions that contain this stage (Megatron's modules, or a trainer's own); a
    //! whole-layer capture (no regions named) contains every stage with layer >= 0.
    region_set captured_by;
    //! The forward reads device data back to the host (a D2H copy and a sync): cannot be captured.
    bool synchronizes_with_host = false;
    //! Launch shapes come from data an earlier stage read back: a graph would freeze one step's shapes.
    bool shapes_depend_on_data = false;
    //! Kernels take host values read at launch (a dropout seed, a loss scale, a step count): a
    //! graph would freeze the values of the step it was captured in.
    bool passes_host_values = false;
    //! 0: the step's stream; k >= 1: the runner's side stream k (`max_lanes` at most).
    int lane = 0;
    //! A lane stage that stays in its neighbours' segment (joined at the segment's end).
    bool branch = false;
    //! Module inputs this stage keeps for its backward (activation offloading may move them).
    offload_name_set saves;
    //! Module inputs this stage writes that a later stage of its layer keeps (e.g. attention
    //! writes the pre-MLP norm's input, which the MLP keeps).
    offload_name_set makes;
    //! Runs only while a device flag holds (capscope/stage/stage_guard.hpp): a conditional node
    //! when captured; `guard_flag` names the flag.
    guard_kind guarded = guard_kind::none;
    std::string_view guard_flag;
    //! A layer schema's guarded stage whose flag a stage before the layer writes (step_begin, an
    //! earlier layer), where the schema cannot see it (`flag_writer::before_layer`).
    bool guard_flag_written_before = false;
    //! Guard flags this stage writes (a layer schema's `writes_flags<...>`; at run time the plan
    //! reads what a stage writes from its declared outputs instead).
    region_set flags_written;
    //! Its launches change every step (host values, sizes known on the host before the step), and
    //! it is captured anyway: before each replay the runner records it again, alone, and updates its
    //! nodes in the executable graph (capscope/run/segment_executor.hpp, plan rule P21).
    bool updated_in_graph = false;

    constexpr bool capturable() const { return !synchronizes_with_host && !shapes_depend_on_data && (!passes_host_values || updated_in_graph); }
    friend constexpr bool operator==(const stage_facts&, const stage_facts&) = default;
};

//! Side streams a runner may give stages (`stage::lane` 1..max_lanes).
inline constexpr int max_lanes = 8;

struct stage {
    std::string name; //!< e.g. "layer1.moe_router"; the error scope while the stage runs
    int layer = -1;
    stage_kind_id kind = stage_kind::other; //!< a predefined kind, or the trainer's own name
    region_set captured_by;                 //!< see stage_facts
    bool synchronizes_with_host = false;
    bool shapes_depend_on_data = false;
    bool passes_host_values = false; //!< see stage_facts
    bool updated_in_graph = false;   //!< see stage_facts: captured, and its nodes updated before each replay
    int lane = 0;                    //!< see stage_facts
    bool branch = false;             //!< see stage_facts
    offload_name_set makes;          //!< see stage_facts
    //! Runs only when (or while) a device flag holds: `run_if(flag)`, `run_while(flag)`.
    stage_guard guard;
    stream_fn forward;               //!< empty for backward-only work (a gradient reduction)
    stream_fn backward;              //!< empty for forward-only work (optimizer step, zeroing, a frozen layer)
    std::vector<tensor_ref> inputs;  //!< read by forward (and by backward)
    std::vector<tensor_ref> outputs; //!< written by forward (read by backward)
    std::vector<tensor_ref> backward_inputs;  //!< read by backward, besides inputs, outputs and saves
    std::vector<tensor_ref> backward_outputs; //!< written by backward (what other streams may touch)
    //! `inputs` and `outputs` name every buffer the stage's work touches that may differ between
    //! microbatches or after a rebind (what its own state points to included), and with
    //! `backward_inputs` and `backward_outputs` every buffer it shares with work on another
    //! stream (its layer's parameters and gradients aside: the composition knows those). Only
    //! then may a graph captured for one binding replay another (microbatches share graphs, and
    //! a rebind keeps graphs, only for stages that say so), and only then is the stage ordered
    //! against other streams by what it touches; an undeclared stage is ordered against all.
    bool buffers_declared = false;
    //! Runs only while its segment is captured, once per capture, never in eager runs or replays
    //! (a capture-time hook, hooks/with_hooks.hpp): host work that sets up what the graph needs.
    bool capture_only = false;
    //! Runs in the step's last microbatch only (a gradient reduction: earlier microbatches
    //! accumulate locally). The stage is in every microbatch's list, so the lists stay alike;
    //! the plan leaves out its calls in the others.
    bool last_microbatch_only = false;
    //! Runs in the step's first microbatch only (a gather whose buffer keeps what it gathered for
    //! the step); the plan leaves out its calls in the others.
    bool first_microbatch_only = false;
    //! Streams the stage forks work onto and joins back before it returns.
    std::vector<stream_handle> forks_to;
    //! What the stage keeps from its forward for its backward, by module input (its facts'
    //! `saves`): tensors activation offloading may move out and back.
    std::vector<saved_tensor> saves;
    //! For a stage that makes collective calls: what decides those calls besides its declared
    //! buffers (a reduction's bucket size, an all-gather's element type and count), so that ranks
    //! that would issue other calls do not fingerprint alike (capscope/plan/fingerprint.hpp).
    std::string collective_calls;
    //! Put in by capscope (a hook, an activation copy), not a stage of the trainer's layer
    //! schemas: the bind-time schema check passes over it.
    bool added = false;
    //! Other layers whose parameters this stage reads besides its own (a kernel fused across a
    //! block boundary normalises with the next block's norm weights: {layer + 1}). The plan orders
    //! it after what writes them (a gather hook of that layer), and rule P19 refuses the read when
    //! that layer's own writer has not run before it in the step.
    std::vector<int> reads_parameters_of;

    bool capturable() const { return facts().capturable(); }
    stage_facts facts() const {
        offload_name_set kept;
        for (const saved_tensor& t : saves) kept.insert(t.module);
        return {kind, layer, captured_by, synchronizes_with_host, shapes_depend_on_data, passes_host_values, lane, branch, kept, makes, guard.kind,
                guard ? std::string_view(guard.predicate.name) : std::string_view(), false, {}, updated_in_graph};
    }
    //! Same work on the same declared buffers: a graph captured from one replays the other. False
    //! when either stage leaves its buffers undeclared.
    bool same_binding(const stage& o) const {
        return buffers_declared && o.buffers_declared && forward == o.forward && backward == o.backward && inputs == o.inputs &&
               outputs == o.outputs && backward_inputs == o.backward_inputs && backward_outputs == o.backward_outputs && saves == o.saves &&
               guard == o.guard;
    }
};

//! Eager execution on one stream (lanes are the runner's): each stage's forward in order, under
//! its name as the error scope.
inline void run_forward(std::span<const stage> stages, stream_handle s) {
    for (const stage& st : stages) {
        if (!st.forward) continue;
        scope_label label(st.name);
        st.forward(s);
    }
}
//! Each stage's backward, in reverse order (stages without one are skipped).
inline void run_backward(std::span<const stage> stages, stream_handle s) {
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
        if (!it->backward) continue;
        scope_label label(it->name);
        it->backward(s);
    }
}

} // namespace capscope
