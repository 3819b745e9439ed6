#pragma once
//! @file
//! The stage seam: every layer is a fixed sequence of stages, each a forward and a backward
//! callable on a stream, bound at set-up to device buffers whose addresses never change. A
//! stage is tagged with the capture modules (Megatron's `--cuda-graph-modules` values) whose
//! capture region contains it, and says whether it synchronises with the host (such a stage
//! cannot be inside a graph). The capture engine reads exactly this.

#include <capscope/cuda/error.hpp>
#include <capscope/vocabulary/capture_module.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

//! A non-owning callable `void(cudaStream_t)`: a pointer and a function, no allocation, no
//! virtual call. The callee must outlive it (stages point into their layer).
class stream_fn {
public:
    stream_fn() = default;
    //! Binds a member function: `stream_fn::of<&block::forward>(this)`.
    template <auto Method, class C>
    static stream_fn of(C* object) noexcept {
        stream_fn f;
        f.object_ = object;
        f.call_ = [](void* o, cudaStream_t s) { (static_cast<C*>(o)->*Method)(s); };
        return f;
    }
    void operator()(cudaStream_t s) const { call_(object_, s); }
    explicit operator bool() const noexcept { return call_ != nullptr; }

private:
    void* object_ = nullptr;
    void (*call_)(void*, cudaStream_t) = nullptr;
};

//! What a stage computes; the dense/MoE/Mamba split follows Megatron's TransformerLayer.
enum class stage_kind : std::uint8_t {
    embedding,      //!< token + position embedding (outside every per-layer capture region)
    attention,      //!< input norm, self-attention, residual add
    mlp,            //!< pre-MLP norm, dense MLP, residual add
    moe_router,     //!< pre-MLP norm, router logits, top-k gates
    moe_preprocess, //!< token permutation into per-expert buffers
    moe_experts,    //!< expert MLPs, unpermute/combine, residual add
    mamba,          //!< norm, gated linear recurrence, residual add
    head,           //!< final norm, LM head, cross-entropy loss
};

//! A device tensor a stage reads or writes; the capture engine and offloading work in these.
struct tensor_ref {
    std::string name;
    void* data = nullptr;
    std::size_t bytes = 0;
};

struct stage {
    std::string name; //!< e.g. "layer1.moe_router"
    int layer = -1;   //!< -1 for the embedding and the head
    stage_kind kind{};
    //! The capture modules whose region contains this stage; a whole-layer capture (empty
    //! module list) contains every stage with layer >= 0.
    capscope::capture_module_set captured_by;
    //! True when the forward reads device data back to the host to decide launch shapes
    //! (dropless MoE): such a stage cannot be captured.
    bool synchronizes_with_host = false;
    //! True when the forward's launch shapes come from data read back by an earlier stage
    //! (dropless MoE experts): a graph would freeze one step's shapes.
    bool shapes_depend_on_data = false;
    bool capturable() const { return !synchronizes_with_host && !shapes_depend_on_data; }
    stream_fn forward;
    stream_fn backward;
    std::vector<tensor_ref> inputs;  //!< read by forward (what activation offloading would move)
    std::vector<tensor_ref> outputs; //!< written by forward
};

//! Eager execution: each stage's forward in order, under its name as the error scope.
inline void run_forward(std::span<const stage> stages, cudaStream_t s) {
    for (const stage& st : stages) {
        capscope::cuda::scope_label label(st.name);
        st.forward(s);
    }
}
//! Each stage's backward, in reverse order.
inline void run_backward(std::span<const stage> stages, cudaStream_t s) {
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
        capscope::cuda::scope_label label(it->name);
        it->backward(s);
    }
}

} // namespace gpt
