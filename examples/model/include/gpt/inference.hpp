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

//! What a greedy generation makes: `max_new` tokens per sequence after a prompt of `prompt_len`
//! tokens, the first from the prompt's last logits. A sequence ends when it emits `end_token`
//! (-1: never); its later tokens are `end_token` again. prompt_len + max_new - 1 positions must
//! fit the model's seq_len. A drop-and-pad MoE gives each expert its capacity for the rows of
//! one position, padding rows included; with capacity_factor >= experts / top_k no token is ever
//! dropped, and a sequence's tokens do not depend on the others in its bucket.
struct generation {
    int prompt_len = 1;
    int max_new = 1;
    int end_token = -1;
};

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

    //! Greedy generation with a KV cache (examples/model/src/inference.cu). `set_prompts` writes
    //! `n` prompts of `prompt_len` tokens each (n * prompt_len ids), padded to `rows` sequences.
    void set_prompts(std::span<const int> tokens, int n, int rows, int prompt_len, cudaStream_t s, int slot = 0, int pad_token = 0);
    //! Per bucket: the prompts' forward, the first token, then WHILE 'decoding' { one token per
    //! sequence }. Under inference scope `block` a whole generation is one graph launch (after the
    //! bucket's eager warmup); eagerly, the runner reads the flag on the host before each pass and
    //! after the last. The caches and the loop's state are the model's, one set whatever the
    //! input slot: one generation runs at a time.
    capscope::inference_program generate_program(std::span<const int> bucket_sizes, const generation& g, int slot = 0);
    //! The same work in two programs, for a loop that launches once per token: the prompts'
    //! forward with the first token, and one more token per sequence (no guard).
    capscope::inference_program prefill_program(std::span<const int> bucket_sizes, const generation& g, int slot = 0);
    capscope::inference_program decode_step_program(std::span<const int> bucket_sizes, const generation& g, int slot = 0);
    //! The decode loop's flag in device memory: nonzero while another token is due.
    const int* decoding() const { return decode_.data(); }
    //! Tokens made per sequence by the last generation (the loop's step count); synchronizes `s`.
    //! Fewer than max_new when every real sequence emitted the end token early.
    int tokens_made(cudaStream_t s) const;
    //! The first `n` sequences' generated tokens, [n, max_new]; `g` must be the generation that
    //! ran last (its max_new is the rows' stride). Synchronizes `s`.
    std::vector<int> copy_generated(int n, const generation& g, cudaStream_t s) const;

    //! Logits [capacity * seq_len, vocab]; after a generation that ran a decode step, the last
    //! step's [rows, vocab] (padded rows not zeroed). After a forward on a padded batch (or a
    //! generation that stopped at its first token), rows of padded
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
        int rows, slot, seq;
        void embed(cudaStream_t s) { model->embed(s, {rows, seq}, slot); }
        void head(cudaStream_t s) { model->head(s, {rows, seq}, slot); }
        void whole(cudaStream_t s, int n) { model->forward(n, s, slot); }
    };
    //! A generation's calls for one bucket: the first token after the prompts, and one token.
    struct decode_call {
        inference_model* model;
        int rows, slot;
        generation g;
        void first_token(cudaStream_t s) { model->first_token(s, *this); }
        void embed(cudaStream_t s) { model->decode_embed(s, *this); }
        void head(cudaStream_t s) { model->decode_head(s, *this); }
    };
    io_call* call_for(int rows, int slot, int seq = 0);
    decode_call* decode_call_for(int rows, int slot, const generation& g);
    std::vector<capscope::stage> prompt_stages(token_grid grid, int slot);
    std::vector<capscope::stage> decode_stages(decode_call* c, bool loop);
    capscope::stage first_token_stage(decode_call* c);
    //! The loop's flag (the guard's tensor), and the rest of its state after it.
    capscope::tensor_ref flag_ref() const { return {"decoding", decode_.data(), sizeof(int)}; }
    capscope::tensor_ref loop_state_ref() const { return {"decode.state", decode_.data() + 1, decode_.bytes() - sizeof(int)}; }
    capscope::inference_program generation_program(std::span<const int> sizes, const generation& g, int slot, bool prompt, bool decode,
                                                   bool loop);
    void write_inputs(std::span<const int> tokens, int n, int rows, int per_row, cudaStream_t s, int slot, int pad_token, const char* who);
    void embed(cudaStream_t s, token_grid grid, int slot);
    void head(cudaStream_t s, token_grid grid, int slot);
    void first_token(cudaStream_t s, const decode_call& c);
    void decode_embed(cudaStream_t s, const decode_call& c);
    void decode_head(cudaStream_t s, const decode_call& c);
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
    std::deque<decode_call> decode_calls_;
    //! The decode loop's state (allocated with the first generation program): flag, step,
    //! position, one int spare, then per sequence done and last, then the generated tokens,
    //! packed [rows, max_new] in room for [capacity, seq_len].
    capscope::cuda::device_buffer<int> decode_;
};

} // namespace gpt
