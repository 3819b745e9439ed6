#pragma once
//! @file
//! `training_program`: what a trainer hands a runner. One training step runs `step_begin`
//! (e.g. zeroing the gradients), then for each microbatch its stages' forwards in order and
//! their backwards in reverse (gradients accumulate), then `step_end` (the optimizer).
//!
//! Each microbatch has its own stage list. Stages that are bound identically in every
//! microbatch (same functions, same buffers: the layers of a model with one activation set)
//! share one graph; stages bound to per-microbatch buffers (the inputs and the loss) get one
//! each. Sharing is safe because a microbatch's forward and backward both finish before the
//! next microbatch starts (no pipeline interleaving), so no graph overwrites activations
//! another still needs.

#include <capscope/stage/stage.hpp>

#include <memory>
#include <vector>

namespace capscope {

//! What a layer's stages touch besides the buffers they declare: every stage of layer L reads
//! `layers[L].parameters`, and its backward writes `layers[L].gradients` (capscope/plan/access.hpp).
//! Hooks get them as their context's tensors (capscope/hooks/with_hooks.hpp).
struct layer_buffers {
    std::vector<tensor_ref> parameters, gradients;
};

//! Host work a runner runs before the first warmup step (`before`) and after the last one: the
//! warmup hooks of the pipeline `with_hooks` composed, type-erased (no allocation). The pipeline
//! must outlive the runner.
struct warmup_work {
    const void* pipeline = nullptr;
    void (*run)(const void* pipeline, bool before, stream_handle stream) = nullptr;
};

struct training_program {
    std::vector<stage> step_begin;
    std::vector<std::vector<stage>> microbatches;
    std::vector<stage> step_end;
    //! Per layer, what its stages touch besides their declared buffers; empty when nothing on
    //! another stream touches a layer's parameters or gradients.
    std::vector<layer_buffers> layers;
    warmup_work warmup;
    //! What the stages point to that the program owns (a composition's hooks and buffers,
    //! capscope/hooks/composition.hpp): shared by every copy of the program.
    std::vector<std::shared_ptr<const void>> keepalive;
};

} // namespace capscope
