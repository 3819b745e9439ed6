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
#include <string>
#include <vector>

namespace capscope {

//! What a layer's stages touch besides the buffers they declare: every stage of layer L reads
//! `layers[L].parameters`, and its backward writes `layers[L].gradients` (capscope/plan/access.hpp).
//! Hooks get them as their context's tensors (capscope/hooks/with_hooks.hpp).
//! (Owning; hooks get the same pair as a view, `layer_tensors`: `view_of(buffers)`.)
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

//! A step the device may refuse, which the runner then runs again eagerly: how work whose size a
//! graph cannot know stays captured (dropless MoE with a static per-expert capacity, config
//! option `static_expert_capacity`). During the step a kernel sets `flag` (an int in device
//! memory, declared among some stage's outputs) when the step went past what its graphs were
//! captured for; the optimizer is guarded (run_if) by a flag that is clear then, so the refused
//! step moved no weight. The runner reads `flag` on the host after every step (one 4-byte copy);
//! when it is set, it runs `before` (which puts back what the refused step advanced, such as the
//! dropout generator's offset, and switches the stages to their host-sized path), every call of
//! the step eagerly, then `after`. Rule P18 checks the declaration when a runner is built.
struct step_rerun {
    tensor_ref flag;
    stream_fn before, after;
    std::string reason; //!< what the flag means, for the plan text ("an expert got more tokens than its static capacity")
    explicit operator bool() const noexcept { return flag.data != nullptr; }
};

struct training_program {
    std::vector<stage> step_begin;
    std::vector<std::vector<stage>> microbatches;
    std::vector<stage> step_end;
    //! Per layer, what its stages touch besides their declared buffers; empty when nothing on
    //! another stream touches a layer's parameters or gradients.
    std::vector<layer_buffers> layers;
    //! The model's parameters and gradients outside its layers (the embedding, the head, the
    //! final norm). Like a layer's: the trainer's stages outside the layers read these parameters
    //! and their backwards write these gradients; `step_begin` and `step_end` stages and step hooks
    //! (a global gradient-norm clip) touch them too, so the plan orders those against each other.
    layer_buffers outside_layers;
    warmup_work warmup;
    //! Empty (no flag) unless a step may be refused and rerun (`step_rerun`).
    step_rerun rerun;
    //! The module inputs whose copies `with_offload` added: the plan checks rule P11 on the final
    //! stage lists, so what is added after the copies (hooks) cannot split a producer from its keeper.
    offload_name_set offloaded;
    //! What the stages point to that the program owns (a composition's hooks and buffers,
    //! capscope/compose/composition.hpp): shared by every copy of the program.
    std::vector<std::shared_ptr<const void>> keepalive;
};

} // namespace capscope
