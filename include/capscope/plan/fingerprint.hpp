#pragma once
//! @file
//! A fingerprint of a training plan and its program, equal on ranks that will make the same
//! calls in the same order: the plan's text (segments, graphs, stage names, guards), for every
//! call in plan order its stage's lane, the size of each buffer it declares (forward and
//! backward) and what else decides its collective calls (`stage::collective_calls`: a
//! reduction's bucket size, a gather's element type), and the layers' parameter and gradient
//! buffers. Sizes, never
//! addresses: ranks whose allocators laid the same buffers out differently fingerprint alike, and
//! ranks whose collectives would move different sizes do not. Host-only.

#include <capscope/detail/fnv1a.hpp>
#include <capscope/plan/print.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace capscope {

inline std::uint64_t plan_fingerprint(const training_plan& plan, const training_program& program) {
    using detail::fnv1a;
    std::uint64_t h = fnv1a(to_text(plan, program));
    auto sizes = [&](const std::vector<tensor_ref>& refs) {
        for (const tensor_ref& r : refs) h = fnv1a(r.name + "=" + std::to_string(r.bytes) + ";", h);
    };
    for (const stage_call& c : plan.calls) {
        const stage& s = stage_of(program, c);
        h = fnv1a(s.name + (c.direction == phase::forward ? " fwd lane " : " bwd lane ") + std::to_string(s.lane) + " [" + s.collective_calls + "]: ", h);
        sizes(s.inputs);
        sizes(s.outputs);
        sizes(s.backward_inputs); // a backward hook's buffers: what a reduction moves
        sizes(s.backward_outputs);
    }
    for (const layer_buffers& l : program.layers) {
        sizes(l.parameters);
        sizes(l.gradients);
    }
    return h;
}

} // namespace capscope
