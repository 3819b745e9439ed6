#include <gpt/inference.hpp>
#include <gpt/model.hpp>

#include "gemm.hpp"
#include "kernels.hpp"
#include "layers.hpp"

#include <capscope/cuda/error.hpp>

#include <stdexcept>
#include <string>

namespace gpt {

using capscope::stage;
using capscope::stage_kind;
using capscope::stream_fn;
using capscope::cuda::device_buffer;
using detail::gemm;

template <class T>
inference_model<T>::inference_model(const model_config& cfg, cudaStream_t s)
    : cfg_(detail::validated(cfg)) {
    detail::model_layout<T> layout = detail::declare_model(cfg, /*training=*/false, params_, blas_, activations_, /*scratch=*/nullptr);
    tok_emb_ = layout.tok_emb;
    pos_emb_ = layout.pos_emb;
    final_norm_ = layout.final_norm;
    head_w_ = layout.head_w;
    blocks_ = std::move(layout.blocks);

    const std::size_t t = cfg.tokens(), h = cfg.hidden, v = cfg.vocab;
    inputs_ = device_buffer<int>(input_slots * slot_ints());
    staging_ = capscope::cuda::pinned_buffer<int>(input_slots * slot_ints());
    embedded_ = device_buffer<T>(t * h);
    final_normed_ = device_buffer<T>(t * h);
    logits_ = device_buffer<T>(t * v);
    final_rstd_ = device_buffer<float>(t);
    logits_f32_ = device_buffer<float>(t * v);
    inputs_.fill_bytes(0, s); // token 0 everywhere, 0 real sequences, until set_request
    params_.allocate(cfg.seed, s, /*training_state=*/false);
    activations_.allocate({}); // forward only: nothing to offload
    for (auto& e : staged_) e.record(s);
    bind_chain(blocks_, embedded_.data(), static_cast<const T*>(nullptr));
}

template <class T> void inference_model<T>::load_parameters(const gpt_model<T>& trained, cudaStream_t s) {
    params_.copy_values_from(trained.parameters(), s);
}

template <class T>
void inference_model<T>::set_request(std::span<const int> tokens_in, int n, int rows, cudaStream_t s, int slot, int pad_token) {
    if (slot < 0 || slot >= input_slots)
        throw std::out_of_range("set_request: input slot " + std::to_string(slot) + " is outside [0, " + std::to_string(input_slots) + ")");
    if (n < 1 || n > rows || rows > cfg_.batch)
        throw std::out_of_range("set_request: need 1 <= n (" + std::to_string(n) + ") <= rows (" + std::to_string(rows) +
                                ") <= the model's capacity (" + std::to_string(cfg_.batch) + " sequences, model_config::batch)");
    const std::size_t seq = std::size_t(cfg_.seq_len);
    if (tokens_in.size() != std::size_t(n) * seq)
        throw std::invalid_argument("set_request: expected " + std::to_string(n) + " x seq_len " + std::to_string(cfg_.seq_len) +
                                    " tokens, got " + std::to_string(tokens_in.size()));
    if (pad_token < 0 || pad_token >= cfg_.vocab)
        throw std::out_of_range("set_request: pad token " + std::to_string(pad_token) + " is outside the vocabulary");
    for (std::size_t i = 0; i < tokens_in.size(); ++i)
        if (tokens_in[i] < 0 || tokens_in[i] >= cfg_.vocab)
            throw std::out_of_range("set_request: token " + std::to_string(tokens_in[i]) + " at " + std::to_string(i) +
                                    " is outside the vocabulary [0, " + std::to_string(cfg_.vocab) + ")");
    staged_[slot].synchronize(); // the slot's previous copy has left the staging memory
    int* host = staging_.data() + std::size_t(slot) * slot_ints();
    std::copy(tokens_in.begin(), tokens_in.end(), host);
    std::fill(host + tokens_in.size(), host + std::size_t(rows) * seq, pad_token);
    host[cfg_.tokens()] = n;
    CAPSCOPE_CHECK(cudaMemcpyAsync(tokens(slot), host, std::size_t(rows) * seq * sizeof(int), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(valid(slot), host + cfg_.tokens(), sizeof(int), cudaMemcpyHostToDevice, s));
    staged_[slot].record(s);
}

template <class T> typename inference_model<T>::io_call* inference_model<T>::call_for(int rows, int slot) {
    if (rows < 1 || rows > cfg_.batch)
        throw std::out_of_range("inference_model: " + std::to_string(rows) + " rows is outside [1, " + std::to_string(cfg_.batch) +
                                "] (the capacity, model_config::batch)");
    if (slot < 0 || slot >= input_slots) throw std::out_of_range("inference_model: no input slot " + std::to_string(slot));
    for (io_call& c : calls_)
        if (c.rows == rows && c.slot == slot) return &c;
    return &calls_.emplace_back(io_call{this, rows, slot});
}

template <class T> std::vector<stage> inference_model<T>::forward_stages(int rows, int slot) {
    io_call* io = call_for(rows, slot);
    const std::size_t t = std::size_t(rows) * cfg_.seq_len, h = cfg_.hidden, v = cfg_.vocab;
    const std::string at = "[" + std::to_string(rows) + "]";
    std::vector<stage> list;
    stage embed;
    embed.name = "embedding" + at;
    embed.kind = stage_kind::embedding;
    embed.buffers_declared = true;
    embed.forward = stream_fn::of<&io_call::embed>(io);
    embed.inputs = {{"tokens.slot" + std::to_string(slot), tokens(slot), t * sizeof(int)}};
    embed.outputs = {{"embedding.output", embedded_.data(), t * h * sizeof(T)}};
    list.push_back(std::move(embed));
    const token_grid grid{rows, cfg_.seq_len};
    for (const auto& b : blocks_)
        for (stage& st : b->forward_stages(grid)) list.push_back(std::move(st));
    stage head;
    head.name = "head" + at;
    head.kind = stage_kind::head;
    head.buffers_declared = true;
    head.forward = stream_fn::of<&io_call::head>(io);
    head.inputs = {{"head.input", const_cast<T*>(blocks_.back()->output()), t * h * sizeof(T)},
                   {"valid.slot" + std::to_string(slot), valid(slot), sizeof(int)}};
    head.outputs = {{"logits", logits_.data(), t * v * sizeof(T)}};
    list.push_back(std::move(head));
    return list;
}

template <class T> capscope::inference_program inference_model<T>::inference_program(std::span<const int> sizes, int slot) {
    capscope::inference_program p;
    for (int rows : sizes) {
        p.buckets.push_back(forward_stages(rows, slot));
        p.bucket_sizes.push_back(rows);
    }
    p.eager_forward = capscope::sized_stream_fn::of<&io_call::whole>(call_for(1, slot));
    return p;
}

template <class T> void inference_model<T>::forward(int rows, cudaStream_t s, int slot) {
    call_for(rows, slot);
    embed(s, rows, slot);
    for (const auto& b : blocks_) b->forward_on({rows, cfg_.seq_len}, s);
    head(s, rows, slot);
}

template <class T> std::vector<float> inference_model<T>::copy_logits(int n, cudaStream_t s) const {
    if (n < 1 || n > cfg_.batch) throw std::out_of_range("copy_logits: " + std::to_string(n) + " sequences is outside [1, capacity]");
    const std::size_t count = std::size_t(n) * cfg_.seq_len * cfg_.vocab;
    kernels::cast_to_float(logits_.data(), logits_f32_.data(), long(count), s);
    std::vector<float> out(count);
    CAPSCOPE_CHECK(cudaMemcpyAsync(out.data(), logits_f32_.data(), count * sizeof(float), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return out;
}

template <class T> void inference_model<T>::embed(cudaStream_t s, int rows, int slot) {
    kernels::embedding_forward(tokens(slot), params_.value(tok_emb_), params_.value(pos_emb_), embedded_.data(), rows, cfg_.seq_len,
                               cfg_.hidden, s);
}

template <class T> void inference_model<T>::head(cudaStream_t s, int rows, int slot) {
    const int t = rows * cfg_.seq_len, h = cfg_.hidden, v = cfg_.vocab;
    kernels::rms_norm_forward(blocks_.back()->output(), params_.value(final_norm_), final_normed_.data(), final_rstd_.data(), t, h, s);
    gemm(blas_, s, {false, false, t, v, h}, final_normed_.data(), params_.value(head_w_), logits_.data());
    kernels::zero_padded_rows(logits_.data(), valid(slot), cfg_.seq_len, t, v, s);
}

template class inference_model<float>;
template class inference_model<__nv_bfloat16>;

} // namespace gpt
