#pragma once
//! @file
//! A vision encoder over a variable number of patches per sample. Each batch is padded to one
//! length: the encoder's `padded_len` for training (`set_inputs`), or, for inference, any length
//! bucket up to it (`set_samples`, `forward_stages(len)`, `inference_program(buckets)`): one
//! graph per bucket in a `capscope::vision_runner`. Attention is bidirectional with a key
//! padding mask, so the outputs on real patches do not depend on the padding. A sample longer
//! than the length is rejected with an error that says so.

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/plan/inference_plan.hpp>

#include <deque>

#include <memory>
#include <span>
#include <vector>

namespace gpt {

template <class T>
class vision_encoder {
public:
    vision_encoder(const vision_config& cfg, cudaStream_t setup_stream);
    vision_encoder(const vision_encoder&) = delete;
    vision_encoder& operator=(const vision_encoder&) = delete;

    //! patches: [batch, padded_len, patch_dim] (the padding rows may hold anything); lengths:
    //! real patches per sample, each in [1, padded_len].
    void set_inputs(std::span<const float> patches, std::span<const int> lengths, cudaStream_t s);
    //! d(loss)/d(output), [batch, padded_len, hidden]; read by backward.
    void set_output_grad(std::span<const float> grad, cudaStream_t s);

    //! Inference input: `lengths.size()` samples (at most `batch`; the rest get one zero patch),
    //! their real patches one after another in `patches` (sum(lengths) x patch_dim), padded to
    //! `padded_len` (a length bucket, at most the config's padded_len) with zeros.
    void set_samples(std::span<const float> patches, std::span<const int> lengths, int padded_len, cudaStream_t s);
    //! The forward on samples padded to `padded_len`: patch embedding, layers, final norm.
    //! Asking twice for one length gives identically bound stages.
    std::vector<stage> forward_stages(int padded_len);
    //! One forward per length bucket, for a `capscope::vision_runner`.
    capscope::inference_program inference_program(std::span<const int> length_buckets);
    //! The real patches' outputs of the last forward on `padded_len`, unpadded: sum(lengths) x
    //! hidden, sample after sample, as floats. Synchronizes `s`.
    std::vector<float> copy_outputs(std::span<const int> lengths, int padded_len, cudaStream_t s);

    void zero_grad(cudaStream_t s) { params_.zero_grads(s); }
    void forward(cudaStream_t s);
    void backward(cudaStream_t s); //!< gradients accumulate: zero_grad first

    const T* output() const { return out_.data(); } //!< [batch, padded_len, hidden]
    const std::vector<stage>& stages() const { return stages_; }
    const vision_config& config() const { return cfg_; }
    parameter_store<T>& parameters() { return params_; }
    const parameter_store<T>& parameters() const { return params_; }
    const T* input_patches() const { return patches_.data(); }

private:
    struct length_call {
        vision_encoder* encoder;
        int len;
        void embed(cudaStream_t s) { encoder->embed_grid(s, len); }
        void norm(cudaStream_t s) { encoder->norm_grid(s, len); }
    };
    length_call* call_for(int padded_len);
    void embed_forward(cudaStream_t s) { embed_grid(s, cfg_.padded_len); }
    void embed_grid(cudaStream_t s, int len);
    void norm_grid(cudaStream_t s, int len);
    void embed_backward(cudaStream_t s);
    void norm_forward(cudaStream_t s) { norm_grid(s, cfg_.padded_len); }
    void norm_backward(cudaStream_t s);

    vision_config cfg_;
    capscope::cuda::blas_handle blas_;
    parameter_store<T> params_;
    capscope::activation_store activations_; //!< the blocks' kept tensors (outlives them)
    backward_scratch scratch_;                //!< what the blocks' backwards share (training)
    typename parameter_store<T>::id patch_w_, pos_emb_, final_norm_;
    capscope::cuda::device_buffer<int> lengths_;
    std::vector<std::unique_ptr<block<T>>> blocks_;
    capscope::cuda::device_buffer<float> staging_, rstd_;
    capscope::cuda::device_buffer<T> patches_, embedded_, out_, d_out_, d_last_;
    std::vector<stage> stages_;
    std::deque<length_call> calls_;
};

} // namespace gpt
