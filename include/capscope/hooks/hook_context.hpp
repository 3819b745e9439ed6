#pragma once
//! @file
//! What a hook may touch, by phase: every hook gets the stream it enqueues on, its layer, the
//! microbatch and the layer's parameters; only a backward hook gets the layer's gradients (they
//! are complete only once the layer's backward ran). A gradient reduction written against
//! `backward_context` and declared for another phase does not compile (rule H1).

#include <capscope/hooks/hook_phase.hpp>
#include <capscope/stage/program.hpp>
#include <capscope/stage/stream_fn.hpp>
#include <capscope/stage/tensor_ref.hpp>

#include <span>

namespace capscope {

//! A layer's tensors, as the trainer binds them for its hooks: a view. `layer_buffers`
//! (capscope/stage/program.hpp) is the same pair owning its lists, as a program and a
//! `composition` keep it; `view_of` makes the one from the other.
struct layer_tensors {
    std::span<const tensor_ref> parameters;
    std::span<const tensor_ref> gradients;
};

//! The view of `b`, valid while `b` lives.
inline layer_tensors view_of(const layer_buffers& b) noexcept { return {b.parameters, b.gradients}; }

template <hook_phase P>
class hook_context {
public:
    constexpr hook_context(stream_handle stream, int layer, int microbatch, const layer_tensors& tensors) noexcept
        : stream_(stream), layer_(layer), microbatch_(microbatch), tensors_(&tensors) {}

    static constexpr hook_phase phase = P;
    //! The stream to enqueue on: inside a captured segment, the capturing stream.
    constexpr stream_handle stream() const noexcept { return stream_; }
    constexpr int layer() const noexcept { return layer_; }
    //! The microbatch, 0-based; -1 when the hook runs once per step.
    constexpr int microbatch() const noexcept { return microbatch_; }
    constexpr std::span<const tensor_ref> parameters() const noexcept { return tensors_->parameters; }
    //! The layer's gradients: complete only after its backward, so only a backward hook has them.
    constexpr std::span<const tensor_ref> gradients() const noexcept
        requires(P == hook_phase::backward)
    {
        return tensors_->gradients;
    }

private:
    stream_handle stream_;
    int layer_;
    int microbatch_;
    const layer_tensors* tensors_;
};

using forward_pre_context = hook_context<hook_phase::forward_pre>;
using forward_context = hook_context<hook_phase::forward>;
using backward_pre_context = hook_context<hook_phase::backward_pre>;
using backward_context = hook_context<hook_phase::backward>;

//! What a step hook gets (capscope/hooks/hook.hpp, `on_step`): the stream, and every layer's
//! parameters and gradients, in layer order.
class step_context {
public:
    constexpr step_context(stream_handle stream, std::span<const layer_tensors> layers) noexcept : stream_(stream), layers_(layers) {}
    constexpr stream_handle stream() const noexcept { return stream_; }
    constexpr std::span<const layer_tensors> layers() const noexcept { return layers_; }

private:
    stream_handle stream_;
    std::span<const layer_tensors> layers_;
};

//! What a warmup hook gets: the stream; it runs once before, or once after, the eager warmup steps.
struct warmup_context {
    stream_handle stream;
};

} // namespace capscope
