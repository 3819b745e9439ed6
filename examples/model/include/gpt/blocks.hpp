#pragma once
//! @file
//! The model's blocks. Each declares its parameters (in a `parameter_store`), the tensors it
//! keeps for its backward (in the model's activation store) and its backward's working memory
//! (in the shared `backward_scratch`), and owns the rest of its activations and the gradient of
//! its input; `bind` wires it to the block before (its input) and after (the gradient of its
//! output), resolves those addresses and builds its stages.
//! A dense layer is attention + mlp, an MoE layer attention + moe, a Mamba layer one mamba block.

#include <gpt/backward_scratch.hpp>
#include <gpt/config.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/offload/activation_store.hpp>
#include <capscope/stage/stage.hpp>

#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

// The stage seam is capscope's: the model fills it, the runner reads it.
using capscope::stage;
using capscope::stage_kind;
using capscope::stream_fn;
using capscope::tensor_ref;

enum class attention_kind {
    causal,              //!< decoder self-attention
    bidirectional_padded //!< encoder attention over the first lengths[b] keys of each sample
};

//! The rows a forward runs on: `batch` samples of `seq` positions. A block built for a shape
//! runs forwards on any grid no larger (an inference bucket, a padded length).
struct token_grid {
    int batch = 0, seq = 0;
    int tokens() const { return batch * seq; }
    friend bool operator==(const token_grid&, const token_grid&) = default;
};

//! The largest token grid and the widths a block is built for.
struct block_shape {
    int batch = 0, seq = 0, hidden = 0, heads = 0, ffn_hidden = 0;
    int experts = 0, top_k = 0, inner = 0;
    double capacity_factor = 1.0;
    gpt::moe_mode moe_mode = gpt::moe_mode::drop_and_pad;
    //! Dropless with a static capacity per expert (training; model_config::dropless_capacity_factor).
    double dropless_capacity_factor = 0;
    //! Set to 1 by a training MoE block whose expert got more than its static capacity (the model's flag).
    int* expert_overflow = nullptr;
    float init_stddev = 0.02f;
    bool training = true; //!< false: forward only, no gradient buffers
    float hidden_dropout = 0.f; //!< dense MLP output dropout (training only)
    rng_state* rng = nullptr;   //!< the model's generator state, in device memory (when dropout is on)
    //! Where the tensors a block keeps for its backward live (the model's store; offloading may
    //! move them, capscope/offload/activation_store.hpp).
    capscope::activation_store* activations = nullptr;
    //! The memory every block's backward shares (the model's; training blocks only).
    backward_scratch* scratch = nullptr;
    int tokens() const { return batch * seq; }
    token_grid grid() const { return {batch, seq}; }
    //! Drop-and-pad slots per expert for `tokens` tokens: ceil(capacity_factor * tokens * top_k / experts).
    int capacity(int tokens) const;
    //! The static dropless capacity per expert, 0 without one (and in forward-only blocks, which read the counts back).
    int static_capacity() const {
        return training && moe_mode == gpt::moe_mode::dropless && dropless_capacity_factor > 0 && experts
                   ? static_cast<int>(std::ceil(dropless_capacity_factor * tokens() * top_k / experts))
                   : 0;
    }
    //! Elements of a gradient buffer: none in a forward-only block.
    std::size_t grad_elems(std::size_t n) const { return training ? n : 0; }
};

inline int block_shape::capacity(int tokens) const {
    return experts ? static_cast<int>(std::ceil(capacity_factor * tokens * top_k / experts)) : 0;
}

//! A tensor a block keeps for its backward, in the model's activation store: declared at
//! construction, its address known from bind() on.
template <class T>
struct kept {
    capscope::activation_store::id id = -1; //!< -1: memory of the block's own (ptr)
    T* ptr = nullptr;
    std::size_t size_bytes = 0;
    T* data() const { return ptr; }
    std::size_t bytes() const { return size_bytes; }
};

//! Memory a block's backward uses only while it runs, in the model's shared scratch.
template <class T>
using scratch = backward_scratch::slice<T>;

template <class T>
class block {
public:
    virtual ~block() = default;
    block(const block&) = delete;
    block& operator=(const block&) = delete;

    //! x: this block's input [tokens, hidden]; dy: gradient of its output, written by the next
    //! block's backward (or the head's) before this block's backward runs.
    virtual void bind(const T* x, const T* dy) = 0;
    //! Forward-only stages on `grid` (no larger than the block's shape), reading the bound input.
    //! Asking twice for one grid gives identically bound stages.
    virtual std::vector<stage> forward_stages(token_grid grid) = 0;
    //! The forward on `grid`, eagerly, at any grid up to the shape (no stages made).
    virtual void forward_on(token_grid grid, cudaStream_t s) = 0;
    const T* output() const { return y_.data(); }
    //! The stage that keeps this block's input for its backward (the pre-MLP norm's input, when
    //! the block before is attention) lists it with the rest of what it keeps.
    void keep_input(const capscope::saved_tensor& t) { stages_.front().saves.push_back(t); }
    //! The block's output, when the store holds it (attention's: the pre-MLP norm's input).
    std::optional<capscope::saved_tensor> kept_output() const {
        if (y_.id < 0) return std::nullopt;
        return activations().saved(y_.id);
    }
    //! Gradient of the loss with respect to the input, written by backward.
    const T* input_grad() const { return dx_.data(); }

    //! Greedy decoding (inference blocks): `allocate_decode` makes what a block keeps from one
    //! position to the next (attention: the keys and values; the scan: its state), once, before
    //! any capture; `begin_decode` fills it from the last forward, on the prompts' grid;
    //! `decode_forward` runs one new position of the first `rows` sequences, at the position held
    //! in device memory at `position` (a replay reads the one the last pass wrote). Blocks that
    //! keep nothing run their forward on one position.
    virtual void allocate_decode() {}
    virtual void begin_decode(cudaStream_t, token_grid /*prompt*/) {}
    virtual void decode_forward(cudaStream_t s, int rows, const int* /*position*/) { forward_on({rows, 1}, s); }
    //! What a block keeps from one position to the next (read and written by its decode stage).
    virtual std::vector<tensor_ref> decode_state() const { return {}; }
    //! The stage of `decode_forward` for `rows` sequences: the kind, regions and host facts of the
    //! block's forward on one position (an MoE block's routing reads counts on the host when
    //! dropless: that stage says so, and a guarded decode loop is then refused, P14).
    stage decode_stage(int rows, const int* position);
    const std::vector<stage>& stages() const { return stages_; }

protected:
    block(const block_shape& shape, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name, int layer)
        : shape_(shape), params_(params), blas_(blas), name_(std::move(name)), layer_(layer),
          own_y_(std::size_t(shape.tokens()) * shape.hidden), y_{-1, own_y_.data(), own_y_.bytes()},
          dx_(shape.grad_elems(std::size_t(shape.tokens()) * shape.hidden)), scratch_(shape.scratch) {}

    capscope::activation_store& activations() const {
        if (!shape_.activations) throw std::invalid_argument(name_ + ": the block needs the model's activation store (block_shape::activations)");
        return *shape_.activations;
    }
    //! Declares a tensor of `elems` elements this block keeps for its backward as module input `m`.
    kept<T> keep(capscope::offload_module m, const std::string& what, std::size_t elems) {
        const std::size_t bytes = elems * sizeof(T);
        return {activations().declare(layer_, m, name_ + "." + what, bytes, sizeof(T)), nullptr, bytes};
    }
    //! Its address, once the store is allocated (bind).
    void resolve(kept<T>& k) const {
        if (k.id >= 0) k.ptr = activations().template data_as<T>(k.id);
    }
    //! `elems` elements of the shared backward scratch (none in a forward-only block); in the
    //! constructor, after which `resolve` gives their address in bind.
    template <class U> scratch<U> take_scratch(std::size_t elems) { return scratch_.template take<U>(shape_.grad_elems(elems)); }
    scratch<T> grad_scratch(std::size_t elems) { return take_scratch<T>(elems); }
    template <class U> void resolve(scratch<U>& s) const { scratch_.resolve(s); }
    capscope::saved_tensor saved(const kept<T>& k) const { return activations().saved(k.id); }
    //! The block's output lives in the store, kept for the backward as `m` (attention's output).
    void keep_output(capscope::offload_module m) {
        own_y_ = {};
        y_ = keep(m, "output", std::size_t(shape_.tokens()) * shape_.hidden);
    }

    //! What a stage bound to one grid calls: the block and the grid (kept at a stable address).
    struct grid_call {
        block* self;
        token_grid grid;
    };
    //! The call object of `grid`, made once per grid, so stages asked for twice bind identically.
    grid_call* call_on(token_grid grid) {
        if (grid.batch < 1 || grid.seq < 1 || grid.batch > shape_.batch || grid.seq > shape_.seq)
            throw std::out_of_range(name_ + ": grid " + std::to_string(grid.batch) + "x" + std::to_string(grid.seq) +
                                    " does not fit the block's " + std::to_string(shape_.batch) + "x" + std::to_string(shape_.seq));
        for (grid_call& c : grid_calls_)
            if (c.grid == grid) return &c;
        return &grid_calls_.emplace_back(grid_call{this, grid});
    }
    //! `Derived::Method(cudaStream_t, token_grid)` bound to `grid` as a stream function.
    template <class Derived, void (Derived::*Method)(cudaStream_t, token_grid)>
    stream_fn on_grid(token_grid grid) {
        return stream_fn::of_function<&call_grid<Derived, Method>>(call_on(grid));
    }
    template <class Derived, void (Derived::*Method)(cudaStream_t, token_grid)>
    static void call_grid(grid_call* c, capscope::stream_handle s) {
        (static_cast<Derived*>(c->self)->*Method)(s, c->grid);
    }
    //! A forward-only stage on `grid`, with the bytes its input and output use there.
    stage grid_stage(std::string suffix, stage_kind kind, capscope::capture_module_set captured_by, stream_fn forward, token_grid grid) const {
        stage st = make_stage(std::move(suffix), kind, captured_by, forward, {});
        const std::size_t bytes = std::size_t(grid.tokens()) * shape_.hidden * sizeof(T);
        st.inputs = {ref("input", x_, bytes)};
        st.outputs = {ref("output", y_.data(), bytes)};
        return st;
    }
    tensor_ref ref(std::string what, const void* p, std::size_t bytes) const {
        return {name_ + "." + what, const_cast<void*>(p), bytes};
    }
    //! A stage of this block named "<block>.<suffix>", reading the block input x.
    stage make_stage(std::string suffix, stage_kind kind, capscope::capture_module_set captured_by, stream_fn forward,
                     stream_fn backward) const {
        stage st;
        st.name = name_ + "." + std::move(suffix);
        st.layer = layer_;
        st.kind = kind;
        st.captured_by = captured_by;
        st.forward = forward;
        st.backward = backward;
        st.inputs = {ref("input", x_, activation_bytes())};
        // A block's buffers (its input, its activations, its weights) are the same in every
        // microbatch and bucket; what differs is in the grid it is bound to, named in inputs/outputs.
        st.buffers_declared = true;
        return st;
    }
    tensor_ref output_ref() const { return ref("output", y_.data(), activation_bytes()); }
    std::size_t activation_bytes() const { return std::size_t(shape_.tokens()) * shape_.hidden * sizeof(T); }

    block_shape shape_;
    parameter_store<T>& params_;
    const capscope::cuda::blas_handle& blas_;
    std::string name_;
    int layer_;
    const T* x_ = nullptr;
    const T* dy_ = nullptr;
    capscope::cuda::device_buffer<T> own_y_; //!< the output, unless the store holds it
    kept<T> y_;
    capscope::cuda::device_buffer<T> dx_;
    backward_scratch::layout scratch_;
    std::vector<stage> stages_;
    std::deque<grid_call> grid_calls_;

private:
    struct decode_call {
        block* self;
        int rows;
        const int* position;
    };
    static void call_decode(decode_call* c, capscope::stream_handle s) { c->self->decode_forward(s, c->rows, c->position); }
    std::deque<decode_call> decode_calls_;
};

template <class T> stage block<T>::decode_stage(int rows, const int* position) {
    decode_call* call = nullptr;
    for (decode_call& c : decode_calls_)
        if (c.rows == rows && c.position == position) call = &c;
    if (!call) call = &decode_calls_.emplace_back(decode_call{this, rows, position});
    const std::vector<stage> one = forward_stages({rows, 1});
    // "layer1.attention.decode", "layer1.moe.decode": the block's forward stage, or "moe" for the three of an MoE block.
    const std::string what = one.size() == 1 ? one.front().name.substr(name_.size() + 1) : std::string("moe");
    stage st = grid_stage(what + ".decode", stage_kind::other, {}, stream_fn::of_function<&call_decode>(call), {rows, 1});
    st.kind = one.back().kind;
    st.captured_by = one.back().captured_by;
    for (const stage& f : one) {
        st.synchronizes_with_host = st.synchronizes_with_host || f.synchronizes_with_host;
        st.shapes_depend_on_data = st.shapes_depend_on_data || f.shapes_depend_on_data;
    }
    st.inputs.push_back(ref("position", position, sizeof(int)));
    for (const tensor_ref& kept : decode_state()) st.outputs.push_back(kept);
    return st;
}

template <class T>
class attention_block final : public block<T> {
public:
    attention_block(const block_shape& shape, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name,
                    int layer, attention_kind kind, const int* lengths = nullptr);
    void bind(const T* x, const T* dy) override;
    std::vector<stage> forward_stages(token_grid grid) override;
    void forward(cudaStream_t s) { forward_grid(s, this->shape_.grid()); }
    void forward_grid(cudaStream_t s, token_grid grid);
    void forward_on(token_grid grid, cudaStream_t s) override { forward_grid(s, grid); }
    void backward(cudaStream_t s);
    void allocate_decode() override;
    void begin_decode(cudaStream_t s, token_grid prompt) override;
    void decode_forward(cudaStream_t s, int rows, const int* position) override;
    std::vector<tensor_ref> decode_state() const override {
        return {this->ref("cache_k", cache_k_.data(), cache_k_.bytes()), this->ref("cache_v", cache_v_.data(), cache_v_.bytes())};
    }

private:
    attention_kind kind_;
    capscope::cuda::device_buffer<T> cache_k_, cache_v_; // [batch, seq, hidden] each: the KV cache (decoding)
    const int* lengths_;
    typename parameter_store<T>::id norm_, qkv_w_, out_w_;
    capscope::cuda::device_buffer<float> rstd_, lse_; // per token row; per query row and head (the fused attention's log-sum-exp)
    kept<T> normed_, qkv_, merged_; // qkv_linear; core_attn (the packed Q, K, V); attn_proj (the attention output)
    scratch<T> d_merged_, d_qkv_, d_normed_;
    scratch<float> rowdot_; // rowsum(dO * O) of the attention backward
};

template <class T>
class mlp_block final : public block<T> {
public:
    mlp_block(const block_shape& shape, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name, int layer);
    void bind(const T* x, const T* dy) override;
    std::vector<stage> forward_stages(token_grid grid) override;
    void forward(cudaStream_t s) { forward_grid(s, this->shape_.grid()); }
    void forward_grid(cudaStream_t s, token_grid grid);
    void forward_on(token_grid grid, cudaStream_t s) override { forward_grid(s, grid); }
    void backward(cudaStream_t s);

private:
    typename parameter_store<T>::id norm_, fc1_, fc2_;
    capscope::cuda::device_buffer<float> rstd_;
    capscope::cuda::device_buffer<T> normed_, pre_, act_;
    scratch<T> d_act_, d_pre_, d_normed_;
    // Dropout (when on): the fc2 output before the residual add, its kept elements, its gradient.
    capscope::cuda::device_buffer<T> dropped_;
    scratch<T> d_dropped_;
    capscope::cuda::device_buffer<unsigned char> mask_;

public:
    //! The last forward's dropout mask (1 = kept), [tokens, hidden]; null without dropout.
    const unsigned char* dropout_mask() const { return mask_.data(); }
};

//! Router -> preprocess (permute) -> experts + combine, as three stages.
template <class T>
class moe_block final : public block<T> {
public:
    moe_block(const block_shape& shape, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name, int layer);
    void bind(const T* x, const T* dy) override;
    std::vector<stage> forward_stages(token_grid grid) override;
    void router_forward(cudaStream_t s) { router_grid(s, this->shape_.grid()); }
    void router_grid(cudaStream_t s, token_grid grid);
    void router_backward(cudaStream_t s);
    void preprocess_forward(cudaStream_t s) { preprocess_grid(s, this->shape_.grid()); }
    void preprocess_grid(cudaStream_t s, token_grid grid);
    void preprocess_backward(cudaStream_t s);
    void experts_forward(cudaStream_t s) { experts_grid(s, this->shape_.grid()); }
    void experts_grid(cudaStream_t s, token_grid grid);
    void forward_on(token_grid grid, cudaStream_t s) override {
        router_grid(s, grid);
        preprocess_grid(s, grid);
        experts_grid(s, grid);
    }
    void experts_backward(cudaStream_t s);

    //! Rows of the permuted buffer on `grid` now: experts * capacity (drop-and-pad, or a static
    //! dropless capacity that held) or tokens * top_k (dropless, sized by the counts).
    int permuted_rows(token_grid grid) const;
    int permuted_rows() const { return rows_; } //!< rows allocated
    //! Per-expert assignment counts of the last forward (device memory): kept ones under drop-and-pad.
    const int* expert_counts() const { return counts_.data(); }
    //! With a static dropless capacity: true while the model reruns a refused step, when the
    //! preprocess reads the counts back and sizes the experts by them where the capacity would
    //! not hold (set by the model's rerun functions).
    void set_host_sized(bool on) {
        host_sized_ = on;
        sized_by_counts_ = false;
    }

private:
    //! Rows per expert of the padded layout the experts run on now; 0: packed, sized by the counts.
    int padded_capacity(token_grid grid) const;
    int rows_;
    int static_capacity_;          //!< block_shape::static_capacity()
    bool host_sized_ = false;      //!< a rerun: counts read back
    bool sized_by_counts_ = false; //!< the last forward ran the packed, count-sized layout
    typename parameter_store<T>::id norm_, router_, fc1_, fc2_;
    capscope::cuda::device_buffer<float> rstd_, gate_;
    scratch<float> d_gate_;
    capscope::cuda::device_buffer<int> expert_, counts_, slot_, row_owner_;
    capscope::cuda::pinned_buffer<int> host_counts_;
    capscope::cuda::device_buffer<T> normed_, logits_, act_, expert_out_;
    kept<T> permuted_, pre_; // expert_fc1, moe_act
    scratch<T> d_expert_out_, d_act_, d_pre_, d_permuted_, d_logits_, d_normed_;
};

template <class T>
class mamba_block final : public block<T> {
public:
    mamba_block(const block_shape& shape, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name, int layer);
    void bind(const T* x, const T* dy) override;
    std::vector<stage> forward_stages(token_grid grid) override;
    void forward(cudaStream_t s) { forward_grid(s, this->shape_.grid()); }
    void forward_grid(cudaStream_t s, token_grid grid);
    void forward_on(token_grid grid, cudaStream_t s) override { forward_grid(s, grid); }
    void backward(cudaStream_t s);

    void allocate_decode() override;
    void begin_decode(cudaStream_t s, token_grid prompt) override;
    void decode_forward(cudaStream_t s, int rows, const int* position) override;
    std::vector<tensor_ref> decode_state() const override { return {this->ref("scan_state", decode_state_.data(), decode_state_.bytes())}; }

private:
    typename parameter_store<T>::id norm_, in_proj_, out_proj_;
    capscope::cuda::device_buffer<float> rstd_, state_;
    capscope::cuda::device_buffer<float> decode_state_; // [batch, inner]: the scan's state at the last decoded position
    capscope::cuda::device_buffer<T> normed_, proj_, mixed_;
    scratch<T> d_mixed_, d_proj_, d_normed_;
};

//! Binds blocks in sequence: block i reads block i-1's output and the gradient written by
//! block i+1 (the last one reads `d_last`). Returns the last block's output. The model's
//! activation store must be allocated.
template <class T>
const T* bind_chain(const std::vector<std::unique_ptr<block<T>>>& blocks, const T* input, const T* d_last) {
    const T* x = input;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
        blocks[i]->bind(x, i + 1 < blocks.size() ? blocks[i + 1]->input_grad() : d_last);
        // The block after attention keeps attention's output (the pre-MLP norm's input) for its backward.
        if (i > 0)
            if (auto t = blocks[i - 1]->kept_output()) blocks[i]->keep_input(*t);
        x = blocks[i]->output();
    }
    return x;
}

} // namespace gpt
