#pragma once
//! @file
//! The GPT-style model: token + position embedding, a pattern of dense / MoE / Mamba-style
//! layers, final norm, LM head and cross-entropy, with hand-written backward and an AdamW step.
//! Everything is allocated in the constructor; a step allocates nothing.
//!
//! A training step has `microbatches` microbatches. Each has its own input buffers (tokens,
//! labels) and loss, written by its own embedding and head stages; the layers' stages are shared
//! (one set of activation buffers), and gradients accumulate over the microbatches.
//! `training_program()` hands all of it to a capscope runner.

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/stage/program.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace gpt {

//! Activation offloading for a training model: the policy (a config's
//! `Config::normalized.offload`) and the device ring (capscope/offload/offload_plan.hpp).
struct activation_offload {
    capscope::offload_settings policy;
    capscope::offload_ring ring;
};

struct adamw_config {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.01f;
};

template <class T>
class gpt_model {
public:
    //! With `sharding`, this rank keeps a shard of each layer's parameters and optimizer state
    //! (parameters.hpp; sharded data parallelism, gpt/data_parallel.hpp). The layers are the same.
    //! With `offload`, the tensors the layers keep for their backward are planned and placed as
    //! its policy says; `training_program(scope)` adds the copies.
    //! With `collective_memory`, the buffers collectives read and write come from it (parameters.hpp).
    gpt_model(const model_config& cfg, cudaStream_t setup_stream, std::optional<store_sharding> sharding = std::nullopt,
              const activation_offload& offload = {}, const collective_memory_source& collective_memory = nullptr);
    gpt_model(const gpt_model&) = delete;
    gpt_model& operator=(const gpt_model&) = delete;

    //! Copies a batch (tokens and next-token labels, -1 = no loss) into the fixed input buffers
    //! of `microbatch`. Sizes must be batch * seq_len. Checks every value first.
    void set_batch(int microbatch, std::span<const int> tokens, std::span<const int> labels, cudaStream_t s);
    void set_batch(std::span<const int> tokens, std::span<const int> labels, cudaStream_t s) { set_batch(0, tokens, labels, s); }
    //! The fixed input buffers of a microbatch ([batch * seq_len] each): a caller may write them
    //! directly (no copy through the model); token ids must be in [0, vocab), labels -1 or in range.
    int* tokens(int microbatch) const { return tokens_.data() + std::size_t(checked(microbatch)) * cfg_.tokens(); }
    int* labels(int microbatch) const { return labels_.data() + std::size_t(checked(microbatch)) * cfg_.tokens(); }

    void zero_grad(cudaStream_t s) { params_.zero_grads(s); }
    //! Its stages' forwards, in order (the head computes its loss). Not with a static dropless
    //! capacity, whose refused steps only a runner reruns: that throws std::logic_error.
    void forward(cudaStream_t s, int microbatch = 0);
    void backward(cudaStream_t s, int microbatch = 0); //!< its stages' backwards, in reverse; gradients accumulate
    //! Sets AdamW's hyperparameters in device memory (one launch), read by every later optimizer
    //! step, replayed from a graph or not.
    void set_optimizer(const adamw_config& opt, cudaStream_t s);
    //! AdamW over every parameter with the hyperparameters in device memory. The step count (for
    //! the bias corrections) is kept on the device too, so a captured step stays correct on replay.
    void optimizer_step(cudaStream_t s);
    void optimizer_step(cudaStream_t s, const adamw_config& opt) {
        set_optimizer(opt, s);
        optimizer_step(s);
    }
    //! The mean of the microbatches' losses of the last step (synchronizes `s`).
    float loss(cudaStream_t s) const;
    float microbatch_loss(cudaStream_t s, int microbatch) const; //!< synchronizes `s`

    //! Microbatch 0's stages: embedding, each layer's stages, head.
    const std::vector<stage>& stages() const { return stages_.front(); }
    const std::vector<stage>& stages(int microbatch) const { return stages_[std::size_t(checked(microbatch))]; }
    //! The whole training step for a capscope runner: zero the gradients, every microbatch's
    //! stages, the optimizer step.
    capscope::training_program training_program() const;
    //! The same step with the activation copies the offload policy asks for, placed for a
    //! runner's capture scope (`capscope::capture_scope_of<Config>`). The model must outlive it.
    capscope::training_program training_program(const capscope::capture_scope& scope) const {
        return activations_.with_offload(training_program(), scope);
    }
    //! Where the kept tensors live, and what offloading moves.
    const capscope::activation_store& activations() const { return activations_; }

    const model_config& config() const { return cfg_; }
    parameter_store<T>& parameters() { return params_; }
    const parameter_store<T>& parameters() const { return params_; }
    //! Optimizer steps skipped so far because loss or gradients were not finite (with
    //! model_config::check_finite_on_device; 0 without). Synchronizes `s`.
    int skipped_steps(cudaStream_t s) const;
    //! The finite check's flag (an int: 1 when the last check found loss and gradients finite).
    capscope::tensor_ref all_finite() const { return {"all_finite", all_finite_.data(), all_finite_.bytes()}; }
    //! With a static dropless capacity (model_config::dropless_capacity_factor): the flag an MoE
    //! layer sets when an expert got more tokens than its capacity (the step's rerun flag), and
    //! the one the optimizer is guarded by (no overflow, and finite with check_finite_on_device).
    capscope::tensor_ref expert_overflow() const { return {"expert_overflow", expert_overflow_.data(), expert_overflow_.bytes()}; }
    capscope::tensor_ref may_update() const { return {"may_update", may_update_.data(), may_update_.bytes()}; }
    //! Dynamic loss scaling's state (model_config::loss_scale): the scale the next step's loss
    //! gradient is multiplied by, and the finite steps since it changed. Synchronizes `s`. With
    //! loss scaling on, parameters().grads() holds the scaled gradients; only the program's
    //! update_loss_scale stage changes the scale (a trainer calling forward, backward and
    //! optimizer_step by hand keeps the initial scale, unchecked).
    loss_scale_state loss_scale(cudaStream_t s) const;
    capscope::tensor_ref loss_scale_ref() const { return {"loss_scale", loss_scale_.data(), loss_scale_.bytes()}; }
    //! The dense MLPs' last dropout masks (1 = kept), [tokens, hidden] each; empty without dropout.
    std::vector<const unsigned char*> dropout_masks() const;
    //! The dropout generator's state now (seed, and the offset every dropout call advances). Synchronizes `s`.
    rng_state generator(cudaStream_t s) const;
    //! Per-expert assignment counts of the MoE block in `layer` after the last forward (kept
    //! assignments under drop-and-pad). Throws if that layer is not an MoE layer.
    const int* expert_counts(int layer) const;

private:
    //! What a microbatch's own stages are bound to.
    struct microbatch_io {
        gpt_model* model;
        int microbatch;
        void embedding_forward(cudaStream_t s) { model->embedding_forward(s, microbatch); }
        void embedding_backward(cudaStream_t s) { model->embedding_backward(s, microbatch); }
        void head_forward(cudaStream_t s) { model->head_forward(s, microbatch); }
        void head_backward(cudaStream_t s) { model->head_backward(s, microbatch); }
    };
    int checked(int microbatch) const;
    void embedding_forward(cudaStream_t s, int mb);
    void embedding_backward(cudaStream_t s, int mb);
    void head_forward(cudaStream_t s, int mb);
    void head_backward(cudaStream_t s, int mb);
    void begin_step_stage(cudaStream_t s);
    void check_finite_stage(cudaStream_t s);
    void update_gate_stage(cudaStream_t s);
    void update_loss_scale_stage(cudaStream_t s);
    //! The scale the head multiplies by and the inverse the optimizer does, or null without
    //! dynamic loss scaling.
    const float* device_loss_scale() const { return cfg_.loss_scale.dynamic ? &loss_scale_.data()->scale : nullptr; }
    const float* device_inverse_loss_scale() const { return cfg_.loss_scale.dynamic ? &loss_scale_.data()->inverse : nullptr; }
    void rerun_before(cudaStream_t s); //!< puts back what a refused step advanced; MoE layers sized by their counts
    void rerun_after(cudaStream_t s);  //!< MoE layers back on their static capacity
    void set_moe_host_sized(bool on);
    //! What a refused step advances, and where the step's start keeps a copy that a rerun puts
    //! back (bytes 0: not kept, as the loss scale without loss scaling).
    struct step_snapshot {
        const char* name;
        void* live;
        void* at_start;
        std::size_t bytes;
    };
    std::array<step_snapshot, 3> step_snapshots() const {
        return {{{"dropout_generator", rng_.data(), rng_at_start_.data(), rng_.bytes()},
                 {"skipped_steps", skipped_steps_.data(), skipped_at_start_.data(), skipped_steps_.bytes()},
                 {"loss_scale", loss_scale_.data(), loss_scale_at_start_.data(), cfg_.loss_scale.dynamic ? loss_scale_.bytes() : 0}}};
    }
    bool static_capacity() const {
        return cfg_.moe_mode == moe_mode::dropless && cfg_.dropless_capacity_factor > 0 && cfg_.layer_pattern.find('E') != std::string::npos;
    }

    model_config cfg_;
    capscope::cuda::blas_handle blas_;
    parameter_store<T> params_;
    std::vector<optimizer_arena<T>> arenas_; //!< what optimizer_step steps, found once
    capscope::activation_store activations_; //!< the blocks' kept tensors (outlives them)
    backward_scratch scratch_;                //!< what the blocks' backwards share
    typename parameter_store<T>::id tok_emb_, pos_emb_, final_norm_, head_w_;
    std::vector<std::unique_ptr<block<T>>> blocks_;
    capscope::cuda::device_buffer<int> tokens_, labels_, device_step_;
    capscope::cuda::device_buffer<int> all_finite_, skipped_steps_; //!< the finite check's flag and count
    //! A static dropless capacity: the overflow (rerun) flag, the optimizer's guard, and the skip
    //! count at the step's start (a rerun puts it back, as it does the generator's state).
    capscope::cuda::device_buffer<int> expert_overflow_, may_update_, skipped_at_start_;
    capscope::cuda::device_buffer<rng_state> rng_at_start_;
    capscope::cuda::device_buffer<rng_state> rng_; //!< dropout's generator (seed, offset), in device memory
    //! Dynamic loss scaling's state, and its copy at the step's start (a rerun puts it back).
    capscope::cuda::device_buffer<loss_scale_state> loss_scale_, loss_scale_at_start_;
    capscope::cuda::device_buffer<T> embedded_, final_normed_, logits_, d_logits_, d_final_normed_, d_last_;
    capscope::cuda::device_buffer<float> final_rstd_, row_loss_, loss_, valid_count_, hyperparameters_;
    capscope::cuda::pinned_buffer<float> host_loss_;
    std::vector<microbatch_io> io_;
    std::vector<std::vector<stage>> stages_;
};

} // namespace gpt
