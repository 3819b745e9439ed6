#include <gpt/vision.hpp>

#include "gemm.hpp"
#include "kernels.hpp"

#include <stdexcept>
#include <string>

namespace gpt {

using capscope::cuda::device_buffer;
using detail::gemm;

namespace {
const vision_config& validated(const vision_config& c) {
    c.validate();
    return c;
}
} // namespace

template <class T>
vision_encoder<T>::vision_encoder(const vision_config& cfg, cudaStream_t s)
    : cfg_(validated(cfg)),
      patch_w_(params_.declare("vision.patch_embed", std::size_t(cfg.patch_dim) * cfg.hidden, init_kind::normal, cfg.init_stddev)),
      pos_emb_(params_.declare("vision.positions", std::size_t(cfg.max_patches) * cfg.hidden, init_kind::normal, cfg.init_stddev)),
      lengths_(cfg.batch) {
    block_shape sh;
    sh.batch = cfg.batch;
    sh.seq = cfg.padded_len;
    sh.hidden = cfg.hidden;
    sh.heads = cfg.heads;
    sh.ffn_hidden = cfg.ffn_hidden;
    sh.init_stddev = cfg.init_stddev;
    sh.training = cfg.training;
    sh.activations = &activations_;
    sh.scratch = &scratch_;
    for (int i = 0; i < cfg.layers; ++i) {
        const std::string name = "vision.layer" + std::to_string(i);
        blocks_.push_back(std::make_unique<attention_block<T>>(sh, params_, blas_, name, i, attention_kind::bidirectional_padded,
                                                               lengths_.data()));
        blocks_.push_back(std::make_unique<mlp_block<T>>(sh, params_, blas_, name, i));
    }
    final_norm_ = params_.declare("vision.final_norm", cfg.hidden, init_kind::ones);
    const std::size_t t = cfg.tokens(), h = cfg.hidden;
    staging_ = device_buffer<float>(t * std::max<std::size_t>(cfg.patch_dim, h));
    rstd_ = device_buffer<float>(t);
    patches_ = device_buffer<T>(t * cfg.patch_dim);
    embedded_ = device_buffer<T>(t * h);
    out_ = device_buffer<T>(t * h);
    d_out_ = device_buffer<T>(cfg.training ? t * h : 0);
    d_last_ = device_buffer<T>(cfg.training ? t * h : 0);
    params_.allocate(cfg.seed, s, cfg.training);
    activations_.allocate({});
    scratch_.allocate();

    const T* x = bind_chain(blocks_, embedded_.data(), d_last_.data());
    stage embed;
    embed.name = "vision.patch_embed";
    embed.kind = stage_kind::embedding;
    embed.buffers_declared = true;
    embed.forward = stream_fn::of<&vision_encoder::embed_forward>(this);
    embed.backward = stream_fn::of<&vision_encoder::embed_backward>(this);
    embed.inputs = {{"vision.patches", patches_.data(), patches_.bytes()}, {"vision.lengths", lengths_.data(), lengths_.bytes()}};
    embed.outputs = {{"vision.embedded", embedded_.data(), embedded_.bytes()}};
    stages_.push_back(std::move(embed));
    for (const auto& b : blocks_)
        for (const auto& st : b->stages()) stages_.push_back(st);
    stage norm;
    norm.name = "vision.final_norm";
    norm.kind = stage_kind::head;
    norm.buffers_declared = true;
    norm.forward = stream_fn::of<&vision_encoder::norm_forward>(this);
    norm.backward = stream_fn::of<&vision_encoder::norm_backward>(this);
    norm.inputs = {{"vision.final_norm.input", const_cast<T*>(x), t * h * sizeof(T)}};
    norm.outputs = {{"vision.output", out_.data(), out_.bytes()}};
    stages_.push_back(std::move(norm));
}

template <class T> void vision_encoder<T>::set_inputs(std::span<const float> patches, std::span<const int> lengths, cudaStream_t s) {
    const std::size_t want = std::size_t(cfg_.tokens()) * cfg_.patch_dim;
    if (patches.size() != want)
        throw std::invalid_argument("vision_encoder::set_inputs: expected " + std::to_string(want) + " patch values (batch " +
                                    std::to_string(cfg_.batch) + " x padded_len " + std::to_string(cfg_.padded_len) + " x patch_dim " +
                                    std::to_string(cfg_.patch_dim) + "), got " + std::to_string(patches.size()));
    if (lengths.size() != std::size_t(cfg_.batch))
        throw std::invalid_argument("vision_encoder::set_inputs: expected " + std::to_string(cfg_.batch) + " lengths, got " +
                                    std::to_string(lengths.size()));
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] > cfg_.padded_len)
            throw std::out_of_range("vision_encoder::set_inputs: sample " + std::to_string(b) + " has " + std::to_string(lengths[b]) +
                                    " patches, more than this encoder's padded length " + std::to_string(cfg_.padded_len) +
                                    "; use an encoder built for a larger bucket (up to max_patches = " +
                                    std::to_string(cfg_.max_patches) + ") or split the image");
        if (lengths[b] < 1)
            throw std::out_of_range("vision_encoder::set_inputs: sample " + std::to_string(b) + " has " + std::to_string(lengths[b]) +
                                    " patches; every sample needs at least one");
    }
    staging_.copy_from_host(patches, s);
    kernels::cast_from_float(staging_.data(), patches_.data(), long(want), s);
    lengths_.copy_from_host(lengths, s);
}

template <class T> void vision_encoder<T>::set_output_grad(std::span<const float> grad, cudaStream_t s) {
    const std::size_t want = std::size_t(cfg_.tokens()) * cfg_.hidden;
    if (grad.size() != want)
        throw std::invalid_argument("vision_encoder::set_output_grad: expected " + std::to_string(want) + " values, got " +
                                    std::to_string(grad.size()));
    staging_.copy_from_host(grad, s);
    kernels::cast_from_float(staging_.data(), d_out_.data(), long(want), s);
}

template <class T> void vision_encoder<T>::forward(cudaStream_t s) { capscope::run_forward(stages_, s); }
template <class T> void vision_encoder<T>::backward(cudaStream_t s) { capscope::run_backward(stages_, s); }

template <class T> void vision_encoder<T>::embed_grid(cudaStream_t s, int len) {
    const int t = cfg_.batch * len;
    gemm(blas_, s, {false, false, t, cfg_.hidden, cfg_.patch_dim}, patches_.data(), params_.value(patch_w_), embedded_.data());
    kernels::add_positions(embedded_.data(), params_.value(pos_emb_), cfg_.batch, len, cfg_.hidden, s);
}
template <class T> void vision_encoder<T>::embed_backward(cudaStream_t s) {
    const int t = cfg_.tokens();
    const T* dx = blocks_.front()->input_grad();
    gemm(blas_, s, {true, false, cfg_.patch_dim, cfg_.hidden, t}, patches_.data(), dx, params_.grad(patch_w_), 1.f);
    kernels::position_grad(dx, params_.grad(pos_emb_), cfg_.max_patches, cfg_.batch, cfg_.padded_len, cfg_.hidden, s);
}
template <class T> void vision_encoder<T>::norm_grid(cudaStream_t s, int len) {
    kernels::rms_norm_forward(blocks_.back()->output(), params_.value(final_norm_), out_.data(), rstd_.data(), cfg_.batch * len,
                              cfg_.hidden, s);
}

template <class T> typename vision_encoder<T>::length_call* vision_encoder<T>::call_for(int len) {
    if (len < 1 || len > cfg_.padded_len)
        throw std::out_of_range("vision_encoder: padded length " + std::to_string(len) + " is outside [1, " +
                                std::to_string(cfg_.padded_len) + "] (vision_config::padded_len, the largest length bucket)");
    for (length_call& c : calls_)
        if (c.len == len) return &c;
    return &calls_.emplace_back(length_call{this, len});
}

template <class T> std::vector<stage> vision_encoder<T>::forward_stages(int len) {
    length_call* io = call_for(len);
    const std::size_t t = std::size_t(cfg_.batch) * len, h = cfg_.hidden;
    const std::string at = "[" + std::to_string(len) + "]";
    std::vector<stage> list;
    stage embed;
    embed.name = "vision.patch_embed" + at;
    embed.kind = stage_kind::embedding;
    embed.buffers_declared = true;
    embed.forward = stream_fn::of<&length_call::embed>(io);
    embed.inputs = {{"vision.patches", patches_.data(), t * cfg_.patch_dim * sizeof(T)}, {"vision.lengths", lengths_.data(), lengths_.bytes()}};
    embed.outputs = {{"vision.embedded", embedded_.data(), t * h * sizeof(T)}};
    list.push_back(std::move(embed));
    for (const auto& b : blocks_)
        for (stage& st : b->forward_stages({cfg_.batch, len})) list.push_back(std::move(st));
    stage norm;
    norm.name = "vision.final_norm" + at;
    norm.kind = stage_kind::head;
    norm.buffers_declared = true;
    norm.forward = stream_fn::of<&length_call::norm>(io);
    norm.inputs = {{"vision.final_norm.input", const_cast<T*>(blocks_.back()->output()), t * h * sizeof(T)}};
    norm.outputs = {{"vision.output", out_.data(), t * h * sizeof(T)}};
    list.push_back(std::move(norm));
    return list;
}

template <class T> capscope::inference_program vision_encoder<T>::inference_program(std::span<const int> length_buckets) {
    capscope::inference_program p;
    for (int len : length_buckets) {
        p.buckets.push_back(forward_stages(len));
        p.bucket_sizes.push_back(len);
    }
    return p;
}

template <class T>
void vision_encoder<T>::set_samples(std::span<const float> patches, std::span<const int> lengths, int len, cudaStream_t s) {
    call_for(len);
    if (lengths.empty() || lengths.size() > std::size_t(cfg_.batch))
        throw std::invalid_argument("vision_encoder::set_samples: " + std::to_string(lengths.size()) + " samples; give 1 to " +
                                    std::to_string(cfg_.batch) + " (vision_config::batch)");
    std::size_t total = 0;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] < 1 || lengths[b] > len)
            throw std::out_of_range("vision_encoder::set_samples: sample " + std::to_string(b) + " has " + std::to_string(lengths[b]) +
                                    " patches; it must have 1 to " + std::to_string(len) + " (the padded length)");
        total += std::size_t(lengths[b]);
    }
    const std::size_t pd = std::size_t(cfg_.patch_dim);
    if (patches.size() != total * pd)
        throw std::invalid_argument("vision_encoder::set_samples: expected " + std::to_string(total) + " patches x patch_dim " +
                                    std::to_string(cfg_.patch_dim) + " values, got " + std::to_string(patches.size()));
    std::vector<float> padded(std::size_t(cfg_.batch) * std::size_t(len) * pd, 0.f);
    std::vector<int> all_lengths(std::size_t(cfg_.batch), 1); // absent samples: one zero patch, never read back
    const float* src = patches.data();
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        std::copy(src, src + std::size_t(lengths[b]) * pd, padded.begin() + std::ptrdiff_t(b * std::size_t(len) * pd));
        src += std::size_t(lengths[b]) * pd;
        all_lengths[b] = lengths[b];
    }
    staging_.copy_from_host(padded, s);
    kernels::cast_from_float(staging_.data(), patches_.data(), long(padded.size()), s);
    lengths_.copy_from_host(all_lengths, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors die here
}

template <class T> std::vector<float> vision_encoder<T>::copy_outputs(std::span<const int> lengths, int len, cudaStream_t s) {
    call_for(len);
    const std::size_t h = cfg_.hidden, n = std::size_t(cfg_.batch) * len * h;
    kernels::cast_to_float(out_.data(), staging_.data(), long(n), s);
    std::vector<float> padded(n);
    staging_.copy_to_host(padded, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    std::vector<float> out;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] < 1 || lengths[b] > len) throw std::out_of_range("vision_encoder::copy_outputs: a sample length outside [1, padded length]");
        const auto first = padded.begin() + std::ptrdiff_t(b * std::size_t(len) * h);
        out.insert(out.end(), first, first + std::ptrdiff_t(std::size_t(lengths[b]) * h));
    }
    return out;
}
template <class T> void vision_encoder<T>::norm_backward(cudaStream_t s) {
    const T* x = blocks_.back()->output();
    kernels::rms_norm_weight_grad(x, rstd_.data(), d_out_.data(), params_.grad(final_norm_), cfg_.tokens(), cfg_.hidden, s);
    kernels::rms_norm_backward(x, params_.value(final_norm_), rstd_.data(), d_out_.data(), static_cast<const T*>(nullptr), d_last_.data(),
                               cfg_.tokens(), cfg_.hidden, s);
}

template class vision_encoder<float>;
template class vision_encoder<__nv_bfloat16>;
template class vision_encoder<__half>;

} // namespace gpt
