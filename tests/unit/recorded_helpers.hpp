#pragma once
// A declared program made again the way an in-place trainer makes it: its stages as marks, in
// the order the trainer's own loops reach them (capscope/plan/recorded_program.hpp).

#include <capscope/plan/recorded_program.hpp>

#include <algorithm>

namespace recorded_helpers {

inline capscope::marked_region mark_of(const capscope::stage& s, bool backward) {
    capscope::marked_region m;
    m.layer = s.layer;
    m.kind = s.kind;
    m.name = s.name;
    m.regions = s.captured_by;
    m.reads = backward ? s.backward_inputs : s.inputs;
    m.writes = backward ? s.backward_outputs : s.outputs;
    m.buffers_declared = s.buffers_declared;
    m.synchronizes_with_host = s.synchronizes_with_host;
    m.shapes_depend_on_data = s.shapes_depend_on_data;
    m.passes_host_values = s.passes_host_values;
    m.reads_parameters_of = s.reads_parameters_of;
    if (!backward) m.saves = s.saves, m.makes = s.makes; // a forward's facts
    m.guard = s.guard;
    return m;
}

//! `p`'s stages marked as a loop-first trainer reaches them: step_begin, then per microbatch the
//! forwards in order and the backwards in reverse, then step_end.
inline capscope::training_program recorded(const capscope::training_program& p) {
    using capscope::phase;
    capscope::program_recorder r;
    for (const capscope::stage& s : p.step_begin) r.mark_step_level(mark_of(s, false));
    for (const auto& list : p.microbatches) {
        r.begin_microbatch();
        for (const capscope::stage& s : list)
            if (s.forward) r.mark(phase::forward, mark_of(s, false));
        for (auto it = list.rbegin(); it != list.rend(); ++it)
            if (it->backward) r.mark(phase::backward, mark_of(*it, true));
    }
    for (const capscope::stage& s : p.step_end) r.mark_step_level(mark_of(s, false));
    return r.finish(p.layers, p.outside_layers);
}

} // namespace recorded_helpers
