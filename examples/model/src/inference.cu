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

namespace {
//! One of the model's own stages (embedding, head, the decode loop's): outside the layers, its
//! buffers declared.
stage model_stage(std::string name, stage_kind kind, stream_fn forward, std::vector<capscope::tensor_ref> inputs,
                  std::vector<capscope::tensor_ref> outputs) {
    stage st;
    st.name = std::move(name);
    st.kind = kind;
    st.buffers_declared = true;
    st.forward = forward;
    st.inputs = std::move(inputs);
    st.outputs = std::move(outputs);
    return st;
}
} // namespace

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
    write_inputs(tokens_in, n, rows, cfg_.seq_len, s, slot, pad_token, "set_request");
}

template <class T>
void inference_model<T>::set_prompts(std::span<const int> tokens_in, int n, int rows, int prompt_len, cudaStream_t s, int slot, int pad_token) {
    if (prompt_len < 1 || prompt_len > cfg_.seq_len)
        throw std::out_of_range("set_prompts: prompt length " + std::to_string(prompt_len) + " is outside [1, seq_len " +
                                std::to_string(cfg_.seq_len) + "]");
    write_inputs(tokens_in, n, rows, prompt_len, s, slot, pad_token, "set_prompts");
}

// Rows of `per_row` tokens, packed, then the real row count the head masks by.
template <class T>
void inference_model<T>::write_inputs(std::span<const int> tokens_in, int n, int rows, int per_row, cudaStream_t s, int slot, int pad_token,
                                      const char* who) {
    const std::string w = who;
    if (slot < 0 || slot >= input_slots)
        throw std::out_of_range(w + ": input slot " + std::to_string(slot) + " is outside [0, " + std::to_string(input_slots) + ")");
    if (n < 1 || n > rows || rows > cfg_.batch)
        throw std::out_of_range(w + ": need 1 <= n (" + std::to_string(n) + ") <= rows (" + std::to_string(rows) +
                                ") <= the model's capacity (" + std::to_string(cfg_.batch) + " sequences, model_config::batch)");
    const std::size_t seq = std::size_t(per_row);
    if (tokens_in.size() != std::size_t(n) * seq)
        throw std::invalid_argument(w + ": expected " + std::to_string(n) + " x " + std::to_string(per_row) + " tokens, got " +
                                    std::to_string(tokens_in.size()));
    if (pad_token < 0 || pad_token >= cfg_.vocab)
        throw std::out_of_range(w + ": pad token " + std::to_string(pad_token) + " is outside the vocabulary");
    for (std::size_t i = 0; i < tokens_in.size(); ++i)
        if (tokens_in[i] < 0 || tokens_in[i] >= cfg_.vocab)
            throw std::out_of_range(w + ": token " + std::to_string(tokens_in[i]) + " at " + std::to_string(i) +
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

template <class T> typename inference_model<T>::io_call* inference_model<T>::call_for(int rows, int slot, int seq) {
    if (seq == 0) seq = cfg_.seq_len;
    if (rows < 1 || rows > cfg_.batch)
        throw std::out_of_range("inference_model: " + std::to_string(rows) + " rows is outside [1, " + std::to_string(cfg_.batch) +
                                "] (the capacity, model_config::batch)");
    if (slot < 0 || slot >= input_slots) throw std::out_of_range("inference_model: no input slot " + std::to_string(slot));
    for (io_call& c : calls_)
        if (c.rows == rows && c.slot == slot && c.seq == seq) return &c;
    return &calls_.emplace_back(io_call{this, rows, slot, seq});
}

template <class T> std::vector<stage> inference_model<T>::forward_stages(int rows, int slot) {
    return prompt_stages({rows, cfg_.seq_len}, slot);
}

template <class T> std::vector<stage> inference_model<T>::prompt_stages(token_grid grid, int slot) {
    const int rows = grid.batch;
    io_call* io = call_for(rows, slot, grid.seq);
    const std::size_t t = std::size_t(grid.tokens()), h = cfg_.hidden, v = cfg_.vocab;
    const std::string at = grid.seq == cfg_.seq_len ? "[" + std::to_string(rows) + "]"
                                                    : "[" + std::to_string(rows) + "x" + std::to_string(grid.seq) + "]";
    std::vector<stage> list;
    list.push_back(model_stage("embedding" + at, stage_kind::embedding, stream_fn::of<&io_call::embed>(io),
                               {{"tokens.slot" + std::to_string(slot), tokens(slot), t * sizeof(int)}},
                               {{"embedding.output", embedded_.data(), t * h * sizeof(T)}}));
    for (const auto& b : blocks_)
        for (stage& st : b->forward_stages(grid)) list.push_back(std::move(st));
    list.push_back(model_stage("head" + at, stage_kind::head, stream_fn::of<&io_call::head>(io),
                               {{"head.input", const_cast<T*>(blocks_.back()->output()), t * h * sizeof(T)},
                                {"valid.slot" + std::to_string(slot), valid(slot), sizeof(int)}},
                               {{"logits", logits_.data(), t * v * sizeof(T)}}));
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
    embed(s, {rows, cfg_.seq_len}, slot);
    for (const auto& b : blocks_) b->forward_on({rows, cfg_.seq_len}, s);
    head(s, {rows, cfg_.seq_len}, slot);
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

template <class T> void inference_model<T>::embed(cudaStream_t s, token_grid g, int slot) {
    kernels::embedding_forward(tokens(slot), params_.value(tok_emb_), params_.value(pos_emb_), embedded_.data(), g.batch, g.seq,
                               cfg_.hidden, s);
}

template <class T> void inference_model<T>::head(cudaStream_t s, token_grid g, int slot) {
    const int t = g.tokens(), h = cfg_.hidden, v = cfg_.vocab;
    kernels::rms_norm_forward(blocks_.back()->output(), params_.value(final_norm_), final_normed_.data(), final_rstd_.data(), t, h, s);
    gemm(blas_, s, {false, false, t, v, h}, final_normed_.data(), params_.value(head_w_), logits_.data());
    kernels::zero_padded_rows(logits_.data(), valid(slot), g.seq, t, v, s);
}

// ---- greedy generation -----------------------------------------------------------------------
namespace {
// The decode loop's state, laid out in one int buffer.
kernels::decode_state decode_layout(int* base, int capacity) {
    int* per_row = base + 4;
    return {base, base + 1, base + 2, per_row, per_row + capacity, per_row + 2 * capacity};
}
} // namespace

template <class T>
typename inference_model<T>::decode_call* inference_model<T>::decode_call_for(int rows, int slot, const generation& g) {
    call_for(rows, slot); // checks rows and slot
    if (g.prompt_len < 1 || g.max_new < 1 || g.prompt_len + g.max_new - 1 > cfg_.seq_len)
        throw std::out_of_range("generation: a prompt of " + std::to_string(g.prompt_len) + " tokens and " + std::to_string(g.max_new) +
                                " new ones need " + std::to_string(g.prompt_len + g.max_new - 1) + " positions; the model has seq_len " +
                                std::to_string(cfg_.seq_len) + " (need prompt_len >= 1, max_new >= 1, prompt_len + max_new - 1 <= seq_len)");
    if (g.end_token < -1 || g.end_token >= cfg_.vocab)
        throw std::out_of_range("generation: end token " + std::to_string(g.end_token) + " is outside the vocabulary (or -1 for none)");
    const std::size_t scores = kernels::decode_attention_shared_bytes(cfg_.seq_len, cfg_.hidden / cfg_.heads);
    if (scores > kernels::decode_attention_shared_limit)
        throw std::invalid_argument("generation: decode attention keeps " + std::to_string(cfg_.seq_len) + " scores per head in shared memory (" +
                                    std::to_string(scores) + " bytes, past " + std::to_string(kernels::decode_attention_shared_limit) +
                                    "); use a seq_len of at most about 12,000");
    if (decode_.empty()) {
        for (const auto& b : blocks_) b->allocate_decode(); // first: one that throws leaves nothing half made
        // Allocated here, before any capture, and never again: the stages keep these addresses.
        decode_ = device_buffer<int>(4 + 2 * std::size_t(cfg_.batch) + std::size_t(cfg_.batch) * std::size_t(cfg_.seq_len));
        CAPSCOPE_CHECK(cudaMemset(decode_.data(), 0, decode_.bytes())); // nothing generated yet: zeros, not leftovers
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
    }
    for (decode_call& c : decode_calls_)
        if (c.rows == rows && c.slot == slot && c.g.prompt_len == g.prompt_len && c.g.max_new == g.max_new && c.g.end_token == g.end_token)
            return &c;
    return &decode_calls_.emplace_back(decode_call{this, rows, slot, g});
}

template <class T> void inference_model<T>::first_token(cudaStream_t s, const decode_call& c) {
    const kernels::decode_state st = decode_layout(decode_.data(), cfg_.batch);
    for (const auto& b : blocks_) b->begin_decode(s, {c.rows, c.g.prompt_len});
    kernels::decode_begin(st, c.rows, s);
    kernels::greedy_pick(logits_.data(), c.g.prompt_len, c.g.prompt_len - 1, c.rows, cfg_.vocab, st, c.g.end_token, c.g.max_new, s);
    kernels::decode_advance(st, valid(c.slot), c.rows, c.g.prompt_len, c.g.max_new, c.g.end_token, s);
}

template <class T> void inference_model<T>::decode_embed(cudaStream_t s, const decode_call& c) {
    const kernels::decode_state st = decode_layout(decode_.data(), cfg_.batch);
    kernels::decode_embedding(st.last, st.position, params_.value(tok_emb_), params_.value(pos_emb_), embedded_.data(), c.rows, cfg_.hidden,
                              cfg_.seq_len, s);
}

template <class T> void inference_model<T>::decode_head(cudaStream_t s, const decode_call& c) {
    const kernels::decode_state st = decode_layout(decode_.data(), cfg_.batch);
    const int h = cfg_.hidden, v = cfg_.vocab;
    kernels::rms_norm_forward(blocks_.back()->output(), params_.value(final_norm_), final_normed_.data(), final_rstd_.data(), c.rows, h, s);
    gemm(blas_, s, {false, false, c.rows, v, h}, final_normed_.data(), params_.value(head_w_), logits_.data());
    kernels::greedy_pick(logits_.data(), 1, 0, c.rows, v, st, c.g.end_token, c.g.max_new, s);
    kernels::decode_advance(st, valid(c.slot), c.rows, c.g.prompt_len, c.g.max_new, c.g.end_token, s);
}

template <class T> stage inference_model<T>::first_token_stage(decode_call* c) {
    stage st = model_stage("first_token[" + std::to_string(c->rows) + "]", stage_kind::head, stream_fn::of<&decode_call::first_token>(c),
                           {{"logits", logits_.data(), std::size_t(c->rows) * c->g.prompt_len * cfg_.vocab * sizeof(T)},
                            {"valid.slot" + std::to_string(c->slot), valid(c->slot), sizeof(int)}},
                           {flag_ref(), loop_state_ref()});
    for (const auto& b : blocks_) // the caches it fills
        for (const capscope::tensor_ref& kept : b->decode_state()) st.outputs.push_back(kept);
    return st;
}

template <class T> std::vector<stage> inference_model<T>::decode_stages(decode_call* c, bool loop) {
    const std::size_t h = cfg_.hidden, v = cfg_.vocab, rows = std::size_t(c->rows);
    const int* position = decode_layout(decode_.data(), cfg_.batch).position;
    const std::string at = "[" + std::to_string(c->rows) + "]";
    std::vector<stage> list;
    list.push_back(model_stage("decode.embedding" + at, stage_kind::embedding, stream_fn::of<&decode_call::embed>(c), {loop_state_ref()},
                               {{"embedding.output", embedded_.data(), rows * h * sizeof(T)}}));
    for (const auto& b : blocks_) list.push_back(b->decode_stage(c->rows, position));
    list.push_back(model_stage("decode.head" + at, stage_kind::head, stream_fn::of<&decode_call::head>(c),
                               {{"head.input", const_cast<T*>(blocks_.back()->output()), rows * h * sizeof(T)},
                                {"valid.slot" + std::to_string(c->slot), valid(c->slot), sizeof(int)}},
                               {{"logits", logits_.data(), rows * v * sizeof(T)}, flag_ref(), loop_state_ref()}));
    if (loop)
        for (stage& st : list) st.guard = capscope::run_while(flag_ref());
    return list;
}

template <class T>
capscope::inference_program inference_model<T>::generation_program(std::span<const int> sizes, const generation& g, int slot, bool prompt,
                                                                   bool decode, bool loop) {
    capscope::inference_program p;
    for (int rows : sizes) {
        decode_call* c = decode_call_for(rows, slot, g);
        std::vector<stage> list;
        if (prompt) {
            list = prompt_stages({rows, g.prompt_len}, slot);
            list.push_back(first_token_stage(c));
        }
        if (decode)
            for (stage& st : decode_stages(c, loop)) list.push_back(std::move(st));
        p.buckets.push_back(std::move(list));
        p.bucket_sizes.push_back(rows);
    }
    return p;
}

template <class T>
capscope::inference_program inference_model<T>::generate_program(std::span<const int> sizes, const generation& g, int slot) {
    return generation_program(sizes, g, slot, true, true, true);
}
template <class T>
capscope::inference_program inference_model<T>::prefill_program(std::span<const int> sizes, const generation& g, int slot) {
    return generation_program(sizes, g, slot, true, false, false);
}
template <class T>
capscope::inference_program inference_model<T>::decode_step_program(std::span<const int> sizes, const generation& g, int slot) {
    return generation_program(sizes, g, slot, false, true, false);
}

template <class T> int inference_model<T>::tokens_made(cudaStream_t s) const {
    if (decode_.empty()) throw std::logic_error("tokens_made: no generation program was made, so nothing was generated");
    int step = 0;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&step, decode_layout(const_cast<int*>(decode_.data()), cfg_.batch).step, sizeof(int),
                                   cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return step;
}

template <class T> std::vector<int> inference_model<T>::copy_generated(int n, const generation& g, cudaStream_t s) const {
    if (decode_.empty()) throw std::logic_error("copy_generated: no generation program was made, so nothing was generated");
    if (n < 1 || n > cfg_.batch || g.max_new < 1 || g.max_new > cfg_.seq_len)
        throw std::out_of_range("copy_generated: " + std::to_string(n) + " sequences of " + std::to_string(g.max_new) +
                                " tokens is outside [1, capacity] x [1, seq_len]");
    const kernels::decode_state st = decode_layout(const_cast<int*>(decode_.data()), cfg_.batch);
    std::vector<int> out(std::size_t(n) * std::size_t(g.max_new));
    CAPSCOPE_CHECK(cudaMemcpyAsync(out.data(), st.generated, out.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return out;
}

template class inference_model<float>;
template class inference_model<__nv_bfloat16>;
template class inference_model<__half>;

} // namespace gpt
