#pragma once
//! @file
//! The stage seam. A trainer describes each layer as a fixed sequence of stages: a forward and
//! a backward `stream_fn`, bound once to device buffers whose addresses never change, tagged
//! with the capture modules whose region contains the stage and with the two facts that keep a
//! stage out of a graph. The plan (`capscope/plan/`) reads the facts; the runner calls the
//! functions.

#include <capscope/stage/scope_label.hpp>
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
    stage_kind kind = stage_kind::other;
    int layer = -1; //!< -1: outside the layers (embedding, head, step-level work)
    //! The capture modules whose region contains this stage; a whole-layer capture (empty
    //! module list) contains every stage with layer >= 0.
    capture_module_set captured_by;
    //! The forward reads device data back to the host (a D2H copy and a sync): cannot be captured.
    bool synchronizes_with_host = false;
    //! Launch shapes come from data an earlier stage read back: a graph would freeze one step's shapes.
    bool shapes_depend_on_data = false;

    constexpr bool capturable() const { return !synchronizes_with_host && !shapes_depend_on_data; }
    friend constexpr bool operator==(const stage_facts&, const stage_facts&) = default;
};

struct stage {
    std::string name; //!< e.g. "layer1.moe_router"; the error scope while the stage runs
    int layer = -1;
    stage_kind kind = stage_kind::other;
    capture_module_set captured_by;
    bool synchronizes_with_host = false;
    bool shapes_depend_on_data = false;
    stream_fn forward;
    stream_fn backward;              //!< empty for forward-only work (optimizer step, zeroing)
    std::vector<tensor_ref> inputs;  //!< read by forward
    std::vector<tensor_ref> outputs; //!< written by forward

    bool capturable() const { return facts().capturable(); }
    stage_facts facts() const { return {kind, layer, captured_by, synchronizes_with_host, shapes_depend_on_data}; }
    //! Same work on the same buffers: a graph captured from one replays the other.
    bool same_binding(const stage& o) const {
        return forward == o.forward && backward == o.backward && inputs == o.inputs && outputs == o.outputs;
    }
};

//! Eager execution: each stage's forward in order, under its name as the error scope.
inline void run_forward(std::span<const stage> stages, stream_handle s) {
    for (const stage& st : stages) {
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
