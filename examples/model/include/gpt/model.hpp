#pragma once
//! @file
//! The GPT-style model: token + position embedding, a pattern of dense / MoE / Mamba-style
//! layers, final norm, LM head and cross-entropy, with hand-written backward and an AdamW step.
//! Everything is allocated in the constructor; a step allocates nothing.

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/parameters.hpp>
#include <gpt/stage.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>

#include <memory>
#include <span>
#include <vector>

namespace gpt {

struct adamw_config {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.01f;
};

template <class T>
class gpt_model {
public:
    gpt_model(const model_config& cfg, cudaStream_t setup_stream);
    gpt_model(const gpt_model&) = delete;
    gpt_model& operator=(const gpt_model&) = delete;

    //! Copies a batch (tokens and next-token labels, -1 = no loss) into the model's fixed input
    //! buffers. Sizes must be batch * seq_len.
    void set_batch(std::span<const int> tokens, std::span<const int> labels, cudaStream_t s);

    void forward(cudaStream_t s);  //!< every stage's forward, in order (the head computes the loss)
    void backward(cudaStream_t s); //!< every stage's backward, in reverse order
    //! AdamW over every parameter. The step count (for the bias corrections) is kept on the
    //! device, so a captured step stays correct on replay; the hyperparameters are fixed at the call.
    void optimizer_step(cudaStream_t s, const adamw_config& opt);
    //! Reads the loss of the last forward (synchronizes `s`).
    float loss(cudaStream_t s) const;

    //! Embedding, each layer's stages, head: the seam the capture engine works on.
    const std::vector<stage>& stages() const { return stages_; }
    const model_config& config() const { return cfg_; }
    parameter_store<T>& parameters() { return params_; }
    const parameter_store<T>& parameters() const { return params_; }
    //! Per-expert assignment counts of the MoE block in `layer` after the last forward (kept
    //! assignments under drop-and-pad). Throws if that layer is not an MoE layer.
    const int* expert_counts(int layer) const;

private:
    void embedding_forward(cudaStream_t s);
    void embedding_backward(cudaStream_t s);
    void head_forward(cudaStream_t s);
    void head_backward(cudaStream_t s);

    model_config cfg_;
    capscope::cuda::blas_handle blas_;
    parameter_store<T> params_;
    typename parameter_store<T>::id tok_emb_, pos_emb_, final_norm_, head_w_;
    std::vector<std::unique_ptr<block<T>>> blocks_;
    capscope::cuda::device_buffer<int> tokens_, labels_, device_step_;
    capscope::cuda::device_buffer<T> embedded_, final_normed_, logits_, d_logits_, d_final_normed_, d_last_;
    capscope::cuda::device_buffer<float> final_rstd_, row_loss_, loss_, valid_count_;
    capscope::cuda::pinned_buffer<float> host_loss_;
    std::vector<stage> stages_;
};

} // namespace gpt
