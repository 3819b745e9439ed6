#pragma once
//! @file
//! What one stage call reads and writes: the facts the plan orders streams by
//! (capscope/plan/stream_order.hpp) and the verifier checks (capscope/plan/verify.hpp).
//!
//! A call's accesses come from what its stage declares, and from what the composition knows
//! (`training_program::layers`):
//! - forward: reads `inputs` and the tensors it `saves`; writes `outputs`;
//! - backward: reads `inputs`, `outputs`, `saves` and `backward_inputs`; writes `backward_outputs`;
//! - a trainer's stage of layer L also reads layer L's parameters (and those of the layers it
//!   names in `reads_parameters_of`), and its backward writes layer L's gradients; a trainer's
//!   stage outside the layers does the same with `training_program::outside_layers`; a trainer's
//!   stage of `step_begin` or `step_end` (zeroing, clipping, the optimizer) reads and writes every
//!   layer's parameters and gradients, and those outside the layers;
//! - a guarded stage reads its guard's flag;
//! - a stage that does not declare its buffers (`buffers_declared` false) reads and writes
//!   everything: whatever it touches, it is ordered against all other work.
//! Stages capscope adds (hooks, activation copies: `stage::added`) declare exactly what they touch.

#include <capscope/stage/program.hpp>
#include <capscope/plan/segment.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace capscope {

struct call_access {
    std::vector<tensor_ref> reads, writes;
    bool everything = false; //!< undeclared: reads and writes every buffer
};

//! Whether two tensors share a byte.
inline bool overlaps(const tensor_ref& a, const tensor_ref& b) noexcept {
    if (a.bytes == 0 || b.bytes == 0 || !a.data || !b.data) return false;
    const auto* pa = static_cast<const std::byte*>(a.data);
    const auto* pb = static_cast<const std::byte*>(b.data);
    return pa < pb + b.bytes && pb < pa + a.bytes;
}

inline std::string name_of(const tensor_ref& t) { return t.name.empty() ? std::string("(unnamed buffer)") : t.name; }

//! The buffer that makes two calls conflict (one writes what the other reads or writes), by its
//! name as the first call knows it; none when they do not.
inline std::optional<std::string> conflict(const call_access& a, const call_access& b) {
    // An undeclared call conflicts with any call that touches something: name what the other touches.
    auto first = [](const call_access& x) -> std::optional<std::string> {
        if (!x.writes.empty()) return name_of(x.writes.front());
        if (!x.reads.empty()) return name_of(x.reads.front());
        return std::nullopt;
    };
    if (a.everything && b.everything) return std::string("(every buffer: neither declares its buffers)");
    if (a.everything) return first(b);
    if (b.everything) return first(a);
    for (const tensor_ref& w : a.writes) {
        for (const tensor_ref& r : b.reads)
            if (overlaps(w, r)) return name_of(w);
        for (const tensor_ref& x : b.writes)
            if (overlaps(w, x)) return name_of(w);
    }
    for (const tensor_ref& r : a.reads)
        for (const tensor_ref& w : b.writes)
            if (overlaps(r, w)) return name_of(r);
    return std::nullopt;
}

namespace detail {
inline void append(std::vector<tensor_ref>& to, const std::vector<tensor_ref>& from) { to.insert(to.end(), from.begin(), from.end()); }
} // namespace detail

//! The accesses of `s`'s `dir` function, in the list `part` of `program`.
inline call_access access_of(const stage& s, phase dir, step_part part, const training_program& program) {
    call_access a;
    if (s.guard) a.reads.push_back(s.guard.predicate); // the condition is read before the call (capscope/stage/stage_guard.hpp)
    if (!s.buffers_declared) {
        a.everything = true;
        return a;
    }
    detail::append(a.reads, s.inputs);
    for (const saved_tensor& t : s.saves) a.reads.push_back(t.tensor);
    if (dir == phase::forward) {
        detail::append(a.writes, s.outputs);
    } else {
        detail::append(a.reads, s.outputs);
        detail::append(a.reads, s.backward_inputs);
        detail::append(a.writes, s.backward_outputs);
    }
    if (s.added) return a;
    if (part != step_part::microbatch) {
        for (const layer_buffers& l : program.layers) {
            detail::append(a.writes, l.parameters);
            detail::append(a.writes, l.gradients);
        }
        detail::append(a.writes, program.outside_layers.parameters);
        detail::append(a.writes, program.outside_layers.gradients);
        return a;
    }
    const layer_buffers* own = s.layer < 0 ? &program.outside_layers
                               : std::size_t(s.layer) < program.layers.size() ? &program.layers[std::size_t(s.layer)] : nullptr;
    if (own) {
        detail::append(a.reads, own->parameters);
        if (dir == phase::backward) detail::append(a.writes, own->gradients);
    }
    for (int other : s.reads_parameters_of)
        if (other >= 0 && std::size_t(other) < program.layers.size()) detail::append(a.reads, program.layers[std::size_t(other)].parameters);
    return a;
}

} // namespace capscope
