#pragma once
//! @file
//! The GPT model's forward-only path for serving: the same layers and weights as `gpt_model`
//! (same config and seed, or `load_parameters` from a trained one), with no gradient, optimizer
//! or master-weight state. Activations are allocated once for `model_config::batch` sequences,
//! the model's capacity; a forward runs on any number of rows up to it, so one model serves
//! every bucket of an inference runner (each bucket's stages launch at its size, in the same
//! buffers), and requests past the largest bucket can still run eagerly.
//!
//! Inputs are double-buffered: two input slots, so the next request can be written while the
//! current one runs, and a runner moved between them with `rebind`.

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/plan/inference_plan.hpp>

#include <deque>
#include <memory>
#include <span>
#include <vector>

namespace gpt {

template <class T>
class gpt_model;

template <class T>
class inference_model {
public:
    static constexpr int input_slots = 2;

    inference_model(const model_config& cfg, cudaStream_t setup_stream);
    inference_model(const inference_model&) = delete;
    inference_model& operator=(const inference_model&) = delete;

    //! Copies the weights of a model built from the same config (e.g. after training it).
    void load_parameters(const gpt_model<T>& trained, cudaStream_t s);

    //! Writes a request of `n` sequences (`tokens`: n * seq_len ids) into input slot `slot`,
    //! padded to `rows` sequences (the bucket) with `pad_token`, and the real count the head
    //! masks by. Checks everything first.
    void set_request(std::span<const int> tokens, int n, int rows, cudaStream_t s, int slot = 0, int pad_token = 0);

    //! The forward on `rows` sequences reading input slot `slot`: embedding, every layer's
    //! stages, head (logits; the rows of padded sequences zeroed). Stages asked for twice are
    //! bound identically.
    std::vector<capscope::stage> forward_stages(int rows, int slot = 0);
    //! One forward per bucket size, for an inference runner; its eager_forward runs any size up
    //! to the capacity on the same slot.
    capscope::inference_program inference_program(std::span<const int> bucket_sizes, int slot = 0);
    //! The forward on `rows` sequences, eagerly.
    void forward(int rows, cudaStream_t s, int slot = 0);

    //! Logits [capacity * seq_len, vocab]; after a forward on a padded batch, rows of padded
    //! sequences are zero.
    const T* logits() const { return logits_.data(); }
    //! The first `n` sequences' logits as floats (n * seq_len * vocab); synchronizes `s`. Not for
    //! the timed path (a copy to pageable host memory).
    std::vector<float> copy_logits(int n, cudaStream_t s) const;

    const model_config& config() const { return cfg_; }
    int capacity() const { return cfg_.batch; }
    const parameter_store<T>& parameters() const { return params_; }

private:
    struct io_call {
        inference_model* model;
        int rows, slot;
        void embed(cudaStream_t s) { model->embed(s, rows, slot); }
        void head(cudaStream_t s) { model->head(s, rows, slot); }
        void whole(cudaStream_t s, int n) { model->forward(n, s, slot); }
    };
    io_call* call_for(int rows, int slot);
    void embed(cudaStream_t s, int rows, int slot);
    void head(cudaStream_t s, int rows, int slot);
    int* tokens(int slot) const { return inputs_.data() + std::size_t(slot) * slot_ints(); }
    int* valid(int slot) const { return tokens(slot) + std::size_t(cfg_.tokens()); }
    std::size_t slot_ints() const { return std::size_t(cfg_.tokens()) + 1; }

    model_config cfg_;
    capscope::cuda::blas_handle blas_;
    parameter_store<T> params_;
    capscope::activation_store activations_; //!< the blocks' kept tensors (outlives them)
    typename parameter_store<T>::id tok_emb_, pos_emb_, final_norm_, head_w_;
    std::vector<std::unique_ptr<block<T>>> blocks_;
    capscope::cuda::device_buffer<int> inputs_; //!< per slot: tokens [capacity * seq], then the real sequence count
    capscope::cuda::pinned_buffer<int> staging_; //!< per slot, like inputs_
    capscope::cuda::event staged_[input_slots];  //!< the last copy out of each slot's staging
    capscope::cuda::device_buffer<T> embedded_, final_normed_, logits_;
    capscope::cuda::device_buffer<float> final_rstd_, logits_f32_;
    std::deque<io_call> calls_;
};

} // namespace gpt
