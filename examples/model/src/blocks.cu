// Forward and backward of the model's blocks, written by hand. Shapes (row-major):
// tokens T = batch * seq, hidden H, heads nh with head_dim dh, ffn F, experts E, top-k k.

#include <gpt/blocks.hpp>

#include <algorithm>

#include "block_support.hpp"
#include "gemm.hpp"
#include "kernels.hpp"

namespace gpt {

using capscope::capture_module;
using capture_offload = capscope::offload_module;
using capscope::cuda::device_buffer;
using detail::copy_rows;
using detail::gemm;
using detail::gemm_shape;
using detail::n_elems;

namespace {
kernels::attention_mask mask_of(attention_kind kind) {
    return kind == attention_kind::causal ? kernels::attention_mask::causal : kernels::attention_mask::key_padding;
}
} // namespace

// ---- attention: y = x + Wo . attention(rmsnorm(x)) -------------------------------------------
template <class T>
attention_block<T>::attention_block(const block_shape& sh, parameter_store<T>& params, const capscope::cuda::blas_handle& blas,
                                    std::string name, int layer, attention_kind kind, const int* lengths)
    : block<T>(sh, params, blas, std::move(name), layer), kind_(kind), lengths_(lengths),
      norm_(params.declare(this->name_ + ".input_norm", sh.hidden, init_kind::ones)),
      qkv_w_(params.declare(this->name_ + ".qkv", n_elems(sh.hidden, 3 * sh.hidden), init_kind::normal, sh.init_stddev)),
      out_w_(params.declare(this->name_ + ".proj", n_elems(sh.hidden, sh.hidden), init_kind::normal, sh.init_stddev)),
      rstd_(sh.tokens()), lse_(n_elems(sh.batch * sh.heads, sh.seq)),
      normed_(this->keep(capture_offload::qkv_linear, "normed", n_elems(sh.tokens(), sh.hidden))),
      qkv_(this->keep(capture_offload::core_attn, "qkv", n_elems(sh.tokens(), 3 * sh.hidden))),
      merged_(this->keep(capture_offload::attn_proj, "merged", n_elems(sh.tokens(), sh.hidden))),
      d_merged_(this->grad_scratch(n_elems(sh.tokens(), sh.hidden))), d_qkv_(this->grad_scratch(n_elems(sh.tokens(), 3 * sh.hidden))),
      d_normed_(this->grad_scratch(n_elems(sh.tokens(), sh.hidden))),
      rowdot_(this->template take_scratch<float>(n_elems(sh.batch * sh.heads, sh.seq))) {
    if (kind == attention_kind::bidirectional_padded && !lengths)
        throw std::invalid_argument(this->name_ + ": bidirectional_padded attention needs the device array of lengths");
    this->keep_output(capture_offload::mlp_norm); // the pre-MLP norm's input
}

template <class T> void attention_block<T>::bind(const T* x, const T* dy) {
    this->x_ = x;
    this->dy_ = dy;
    for (kept<T>* k : {&normed_, &qkv_, &merged_, &this->y_}) this->resolve(*k);
    for (scratch<T>* d : {&d_merged_, &d_qkv_, &d_normed_}) this->resolve(*d);
    this->resolve(rowdot_);
    stage st = this->make_stage("attention", stage_kind::attention, {capture_module::attention},
                                stream_fn::of<&attention_block::forward>(this), stream_fn::of<&attention_block::backward>(this));
    st.saves = {this->saved(normed_), this->saved(qkv_), this->saved(merged_)};
    st.makes = {capture_offload::mlp_norm};
    if (lengths_) st.inputs.push_back(this->ref("lengths", lengths_, sizeof(int) * this->shape_.batch));
    st.outputs = {this->output_ref()};
    this->stages_ = {std::move(st)};
}

template <class T> std::vector<stage> attention_block<T>::forward_stages(token_grid g) {
    stage st = this->grid_stage("attention", stage_kind::attention, {capture_module::attention},
                                this->template on_grid<attention_block, &attention_block::forward_grid>(g), g);
    if (lengths_) st.inputs.push_back(this->ref("lengths", lengths_, sizeof(int) * std::size_t(g.batch)));
    return {std::move(st)};
}

template <class T> void attention_block<T>::forward_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int t = g.tokens(), h = sh.hidden;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), t, h, s);
    gemm(this->blas_, s, {false, false, t, 3 * h, h}, normed_.data(), P.value(qkv_w_), qkv_.data());
    kernels::flash_attention_forward(qkv_.data(), merged_.data(), lse_.data(), mask_of(kind_), lengths_, g.batch, g.seq, sh.heads,
                                     h / sh.heads, s);
    copy_rows(this->y_.data(), this->x_, n_elems(t, h), s);
    gemm(this->blas_, s, {false, false, t, h, h}, merged_.data(), P.value(out_w_), this->y_.data(), 1.f);
}

template <class T> void attention_block<T>::backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    const int t = sh.tokens(), h = sh.hidden;
    auto& P = this->params_;
    const T* dy = this->dy_;
    gemm(this->blas_, s, {true, false, h, h, t}, merged_.data(), dy, P.grad(out_w_), 1.f);
    gemm(this->blas_, s, {false, true, t, h, h}, dy, P.value(out_w_), d_merged_.data());
    kernels::flash_attention_backward(qkv_.data(), merged_.data(), lse_.data(), d_merged_.data(), rowdot_.data(), d_qkv_.data(),
                                      mask_of(kind_), lengths_, sh.batch, sh.seq, sh.heads, h / sh.heads, s);
    gemm(this->blas_, s, {true, false, h, 3 * h, t}, normed_.data(), d_qkv_.data(), P.grad(qkv_w_), 1.f);
    gemm(this->blas_, s, {false, true, t, h, 3 * h}, d_qkv_.data(), P.value(qkv_w_), d_normed_.data());
    kernels::rms_norm_weight_grad(this->x_, rstd_.data(), d_normed_.data(), P.grad(norm_), t, h, s);
    kernels::rms_norm_backward(this->x_, P.value(norm_), rstd_.data(), d_normed_.data(), dy, this->dx_.data(), t, h, s);
}

// ---- dense MLP: y = x + W2 . gelu(W1 . rmsnorm(x)) ------------------------------------------
template <class T>
mlp_block<T>::mlp_block(const block_shape& sh, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name,
                        int layer)
    : block<T>(sh, params, blas, std::move(name), layer),
      norm_(params.declare(this->name_ + ".pre_mlp_norm", sh.hidden, init_kind::ones)),
      fc1_(params.declare(this->name_ + ".fc1", n_elems(sh.hidden, sh.ffn_hidden), init_kind::normal, sh.init_stddev)),
      fc2_(params.declare(this->name_ + ".fc2", n_elems(sh.ffn_hidden, sh.hidden), init_kind::normal, sh.init_stddev)),
      rstd_(sh.tokens()), normed_(n_elems(sh.tokens(), sh.hidden)), pre_(n_elems(sh.tokens(), sh.ffn_hidden)),
      act_(n_elems(sh.tokens(), sh.ffn_hidden)), d_act_(this->grad_scratch(n_elems(sh.tokens(), sh.ffn_hidden))),
      d_pre_(this->grad_scratch(n_elems(sh.tokens(), sh.ffn_hidden))), d_normed_(this->grad_scratch(n_elems(sh.tokens(), sh.hidden))) {
    if (sh.training && sh.hidden_dropout > 0.f) {
        if (!sh.rng) throw std::invalid_argument("mlp_block: dropout needs the model's generator state (block_shape::rng)");
        dropped_ = capscope::cuda::device_buffer<T>(n_elems(sh.tokens(), sh.hidden));
        d_dropped_ = this->grad_scratch(n_elems(sh.tokens(), sh.hidden));
        mask_ = capscope::cuda::device_buffer<unsigned char>(n_elems(sh.tokens(), sh.hidden));
    }
}

template <class T> void mlp_block<T>::bind(const T* x, const T* dy) {
    this->x_ = x;
    this->dy_ = dy;
    for (scratch<T>* d : {&d_act_, &d_pre_, &d_normed_, &d_dropped_}) this->resolve(*d);
    stage st = this->make_stage("mlp", stage_kind::mlp, {capture_module::mlp}, stream_fn::of<&mlp_block::forward>(this),
                                stream_fn::of<&mlp_block::backward>(this));
    st.outputs = {this->output_ref()};
    this->stages_ = {std::move(st)};
}

template <class T> std::vector<stage> mlp_block<T>::forward_stages(token_grid g) {
    return {this->grid_stage("mlp", stage_kind::mlp, {capture_module::mlp}, this->template on_grid<mlp_block, &mlp_block::forward_grid>(g), g)};
}

template <class T> void mlp_block<T>::forward_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int t = g.tokens(), h = sh.hidden, f = sh.ffn_hidden;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), t, h, s);
    gemm(this->blas_, s, {false, false, t, f, h}, normed_.data(), P.value(fc1_), pre_.data());
    kernels::gelu_forward(pre_.data(), act_.data(), long(t) * f, s);
    if (!mask_.empty()) { // y = x + dropout(act . W2), the generator read and advanced on the device
        gemm(this->blas_, s, {false, false, t, h, f}, act_.data(), P.value(fc2_), dropped_.data());
        kernels::dropout_add_forward(dropped_.data(), this->x_, this->y_.data(), mask_.data(), sh.rng, sh.hidden_dropout, long(t) * h, s);
        return;
    }
    copy_rows(this->y_.data(), this->x_, n_elems(t, h), s);
    gemm(this->blas_, s, {false, false, t, h, f}, act_.data(), P.value(fc2_), this->y_.data(), 1.f);
}

template <class T> void mlp_block<T>::backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    const int t = sh.tokens(), h = sh.hidden, f = sh.ffn_hidden;
    auto& P = this->params_;
    const T* dy = this->dy_;
    const T* d_branch = dy; // the gradient reaching the fc2 output
    if (!mask_.empty()) {
        kernels::dropout_backward(dy, mask_.data(), d_dropped_.data(), sh.hidden_dropout, long(t) * h, s);
        d_branch = d_dropped_.data();
    }
    gemm(this->blas_, s, {true, false, f, h, t}, act_.data(), d_branch, P.grad(fc2_), 1.f);
    gemm(this->blas_, s, {false, true, t, f, h}, d_branch, P.value(fc2_), d_act_.data());
    kernels::gelu_backward(pre_.data(), d_act_.data(), d_pre_.data(), long(t) * f, s);
    gemm(this->blas_, s, {true, false, h, f, t}, normed_.data(), d_pre_.data(), P.grad(fc1_), 1.f);
    gemm(this->blas_, s, {false, true, t, h, f}, d_pre_.data(), P.value(fc1_), d_normed_.data());
    kernels::rms_norm_weight_grad(this->x_, rstd_.data(), d_normed_.data(), P.grad(norm_), t, h, s);
    kernels::rms_norm_backward(this->x_, P.value(norm_), rstd_.data(), d_normed_.data(), dy, this->dx_.data(), t, h, s);
}

// ---- MoE: y = x + sum_k gate_k * expert_k(rmsnorm(x)) ------------------------------------------
template <class T>
moe_block<T>::moe_block(const block_shape& sh, parameter_store<T>& params, const capscope::cuda::blas_handle& blas, std::string name,
                        int layer)
    : block<T>(sh, params, blas, std::move(name), layer),
      rows_(sh.moe_mode == moe_mode::drop_and_pad ? sh.experts * sh.capacity(sh.tokens())
                                                  : std::max(sh.tokens() * sh.top_k, sh.experts * sh.static_capacity())),
      static_capacity_(sh.static_capacity()),
      norm_(params.declare(this->name_ + ".pre_mlp_norm", sh.hidden, init_kind::ones)),
      router_(params.declare(this->name_ + ".router", n_elems(sh.hidden, sh.experts), init_kind::normal, sh.init_stddev)),
      fc1_(params.declare(this->name_ + ".experts.fc1", n_elems(sh.experts, sh.hidden, sh.ffn_hidden), init_kind::normal, sh.init_stddev)),
      fc2_(params.declare(this->name_ + ".experts.fc2", n_elems(sh.experts, sh.ffn_hidden, sh.hidden), init_kind::normal, sh.init_stddev)),
      rstd_(sh.tokens()), gate_(n_elems(sh.tokens(), sh.top_k)), d_gate_(this->template take_scratch<float>(n_elems(sh.tokens(), sh.top_k))),
      expert_(n_elems(sh.tokens(), sh.top_k)), counts_(sh.experts), slot_(n_elems(sh.tokens(), sh.top_k)), row_owner_(rows_),
      host_counts_(sh.experts), normed_(n_elems(sh.tokens(), sh.hidden)), logits_(n_elems(sh.tokens(), sh.experts)),
      act_(n_elems(rows_, sh.ffn_hidden)), expert_out_(n_elems(rows_, sh.hidden)),
      permuted_(this->keep(capture_offload::expert_fc1, "permuted", n_elems(rows_, sh.hidden))),
      pre_(this->keep(capture_offload::moe_act, "expert_pre_activation", n_elems(rows_, sh.ffn_hidden))), d_expert_out_(this->grad_scratch(n_elems(rows_, sh.hidden))),
      d_act_(this->grad_scratch(n_elems(rows_, sh.ffn_hidden))), d_pre_(this->grad_scratch(n_elems(rows_, sh.ffn_hidden))),
      d_permuted_(this->grad_scratch(n_elems(rows_, sh.hidden))), d_logits_(this->grad_scratch(n_elems(sh.tokens(), sh.experts))),
      d_normed_(this->grad_scratch(n_elems(sh.tokens(), sh.hidden))) {}

template <class T> int moe_block<T>::padded_capacity(token_grid g) const {
    const auto& sh = this->shape_;
    if (sh.moe_mode == moe_mode::drop_and_pad) return sh.capacity(g.tokens());
    return sized_by_counts_ ? 0 : static_capacity_;
}

template <class T> int moe_block<T>::permuted_rows(token_grid g) const {
    const int c = padded_capacity(g);
    return c ? this->shape_.experts * c : g.tokens() * this->shape_.top_k;
}

template <class T> std::vector<stage> moe_block<T>::forward_stages(token_grid g) {
    const bool dropless = this->shape_.moe_mode == moe_mode::dropless && !static_capacity_;
    const std::size_t t = std::size_t(g.tokens()), h = std::size_t(this->shape_.hidden), k = std::size_t(this->shape_.top_k);
    stage router = this->grid_stage("moe_router", stage_kind::moe_router, {capture_module::moe, capture_module::moe_router},
                                    this->template on_grid<moe_block, &moe_block::router_grid>(g), g);
    router.outputs = {this->ref("probs", gate_.data(), t * k * sizeof(float)), this->ref("routing_map", expert_.data(), t * k * sizeof(int))};
    stage pre = this->grid_stage("moe_preprocess", stage_kind::moe_preprocess, {capture_module::moe, capture_module::moe_preprocess},
                                 this->template on_grid<moe_block, &moe_block::preprocess_grid>(g), g);
    pre.synchronizes_with_host = dropless;
    pre.inputs = {this->ref("pre_mlp_norm_output", normed_.data(), t * h * sizeof(T)), router.outputs[1]};
    pre.outputs = {this->ref("permuted_tokens", permuted_.data(), std::size_t(permuted_rows(g)) * h * sizeof(T))};
    if (static_capacity_) pre.outputs.push_back({"expert_overflow", this->shape_.expert_overflow, sizeof(int)});
    stage experts = this->grid_stage("moe_experts", stage_kind::moe_experts, {capture_module::moe},
                                     this->template on_grid<moe_block, &moe_block::experts_grid>(g), g);
    experts.shapes_depend_on_data = dropless;
    experts.inputs = {pre.outputs[0], router.outputs[0], experts.inputs[0]};
    std::vector<stage> out;
    out.push_back(std::move(router));
    out.push_back(std::move(pre));
    out.push_back(std::move(experts));
    return out;
}

template <class T> void moe_block<T>::bind(const T* x, const T* dy) {
    this->x_ = x;
    this->dy_ = dy;
    this->resolve(permuted_);
    this->resolve(pre_);
    this->resolve(d_gate_);
    for (scratch<T>* d : {&d_expert_out_, &d_act_, &d_pre_, &d_permuted_, &d_logits_, &d_normed_}) this->resolve(*d);
    // Dropless reads the counts back, unless a static capacity keeps it capturable (a step past
    // it sets the overflow flag and is rerun).
    const bool dropless = this->shape_.moe_mode == moe_mode::dropless && !static_capacity_;
    stage router = this->make_stage("moe_router", stage_kind::moe_router, {capture_module::moe, capture_module::moe_router},
                                    stream_fn::of<&moe_block::router_forward>(this), stream_fn::of<&moe_block::router_backward>(this));
    router.outputs = {this->ref("probs", gate_.data(), gate_.bytes()), this->ref("routing_map", expert_.data(), expert_.bytes())};

    stage pre = this->make_stage("moe_preprocess", stage_kind::moe_preprocess, {capture_module::moe, capture_module::moe_preprocess},
                                 stream_fn::of<&moe_block::preprocess_forward>(this),
                                 stream_fn::of<&moe_block::preprocess_backward>(this));
    pre.synchronizes_with_host = dropless; // reads the per-expert counts back to size the GEMMs
    pre.inputs = {this->ref("pre_mlp_norm_output", normed_.data(), normed_.bytes()), router.outputs[1]};
    pre.outputs = {this->ref("permuted_tokens", permuted_.data(), permuted_.bytes())};
    if (static_capacity_) pre.outputs.push_back({"expert_overflow", this->shape_.expert_overflow, sizeof(int)});
    pre.makes = {capture_offload::expert_fc1};

    stage experts = this->make_stage("moe_experts", stage_kind::moe_experts, {capture_module::moe},
                                     stream_fn::of<&moe_block::experts_forward>(this),
                                     stream_fn::of<&moe_block::experts_backward>(this));
    experts.shapes_depend_on_data = dropless;
    experts.inputs = {pre.outputs[0], router.outputs[0], experts.inputs[0]};
    experts.outputs = {this->output_ref()};
    experts.saves = {this->saved(permuted_), this->saved(pre_)};
    this->stages_ = {std::move(router), std::move(pre), std::move(experts)};
}

template <class T> void moe_block<T>::router_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int t = g.tokens(), h = sh.hidden;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), t, h, s);
    gemm(this->blas_, s, {false, false, t, sh.experts, h}, normed_.data(), P.value(router_), logits_.data());
    kernels::router_topk(logits_.data(), expert_.data(), gate_.data(), t, sh.experts, sh.top_k, s);
}

template <class T> void moe_block<T>::preprocess_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int t = g.tokens(), k = sh.top_k, e = sh.experts;
    if (sh.moe_mode == moe_mode::drop_and_pad) {
        kernels::assign_slots(expert_.data(), counts_.data(), slot_.data(), row_owner_.data(), t, k, e, sh.capacity(t), s);
    } else if (static_capacity_ && !host_sized_) {
        // Captured: the padded layout; an expert past its capacity flags the step for a rerun.
        sized_by_counts_ = false;
        kernels::assign_slots(expert_.data(), counts_.data(), slot_.data(), row_owner_.data(), t, k, e, static_capacity_, s,
                              sh.expert_overflow);
    } else {
        // The device-to-host sync that makes dropless MoE uncapturable: GEMM sizes come from data.
        kernels::assign_slots(expert_.data(), counts_.data(), slot_.data(), row_owner_.data(), t, k, e, 0, s);
        CAPSCOPE_CHECK(cudaMemcpyAsync(host_counts_.data(), counts_.data(), counts_.bytes(), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        sized_by_counts_ = true;
        if (static_capacity_ && *std::max_element(host_counts_.data(), host_counts_.data() + e) <= static_capacity_) {
            // A rerun, and this layer's experts fit: the very layout (and kernels) the graph takes.
            sized_by_counts_ = false;
            kernels::assign_slots(expert_.data(), counts_.data(), slot_.data(), row_owner_.data(), t, k, e, static_capacity_, s);
        }
    }
    kernels::permute_rows(normed_.data(), row_owner_.data(), permuted_.data(), permuted_rows(g), sh.hidden, sh.top_k, s);
}

template <class T> void moe_block<T>::experts_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int h = sh.hidden, f = sh.ffn_hidden, rows = permuted_rows(g);
    auto& P = this->params_;
    if (const int c = padded_capacity(g)) {
        gemm(this->blas_, s, {false, false, c, f, h}, permuted_.data(), P.value(fc1_), pre_.data(), 0.f, sh.experts, long(c) * h,
             long(h) * f, long(c) * f);
        kernels::gelu_forward(pre_.data(), act_.data(), long(rows) * f, s);
        gemm(this->blas_, s, {false, false, c, h, f}, act_.data(), P.value(fc2_), expert_out_.data(), 0.f, sh.experts, long(c) * f,
             long(f) * h, long(c) * h);
    } else {
        long row = 0;
        for (int e = 0; e < sh.experts; ++e) {
            const int m = host_counts_[e];
            if (m > 0)
                gemm(this->blas_, s, {false, false, m, f, h}, permuted_.data() + row * h, P.value(fc1_) + long(e) * h * f,
                     pre_.data() + row * f);
            row += m;
        }
        kernels::gelu_forward(pre_.data(), act_.data(), long(rows) * f, s);
        row = 0;
        for (int e = 0; e < sh.experts; ++e) {
            const int m = host_counts_[e];
            if (m > 0)
                gemm(this->blas_, s, {false, false, m, h, f}, act_.data() + row * f, P.value(fc2_) + long(e) * f * h,
                     expert_out_.data() + row * h);
            row += m;
        }
    }
    kernels::combine(expert_out_.data(), slot_.data(), gate_.data(), this->x_, this->y_.data(), g.tokens(), h, sh.top_k, s);
}

template <class T> void moe_block<T>::experts_backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    const int h = sh.hidden, f = sh.ffn_hidden, rows = permuted_rows(sh.grid());
    auto& P = this->params_;
    kernels::combine_backward(this->dy_, expert_out_.data(), slot_.data(), row_owner_.data(), gate_.data(), d_expert_out_.data(),
                              d_gate_.data(), sh.tokens(), rows, h, sh.top_k, s);
    if (const int c = padded_capacity(sh.grid())) {
        const int e = sh.experts;
        gemm(this->blas_, s, {true, false, f, h, c}, act_.data(), d_expert_out_.data(), P.grad(fc2_), 1.f, e, long(c) * f,
             long(c) * h, long(f) * h);
        gemm(this->blas_, s, {false, true, c, f, h}, d_expert_out_.data(), P.value(fc2_), d_act_.data(), 0.f, e, long(c) * h,
             long(f) * h, long(c) * f);
        kernels::gelu_backward(pre_.data(), d_act_.data(), d_pre_.data(), long(rows) * f, s);
        gemm(this->blas_, s, {true, false, h, f, c}, permuted_.data(), d_pre_.data(), P.grad(fc1_), 1.f, e, long(c) * h,
             long(c) * f, long(h) * f);
        gemm(this->blas_, s, {false, true, c, h, f}, d_pre_.data(), P.value(fc1_), d_permuted_.data(), 0.f, e, long(c) * f,
             long(h) * f, long(c) * h);
        return;
    }
    long row = 0;
    for (int e = 0; e < sh.experts; ++e) {
        const int m = host_counts_[e];
        float* g2 = P.grad(fc2_) + long(e) * f * h;
        if (m == 0) continue; // an expert that got no token adds nothing to its gradient
        gemm(this->blas_, s, {true, false, f, h, m}, act_.data() + row * f, d_expert_out_.data() + row * h, g2, 1.f);
        gemm(this->blas_, s, {false, true, m, f, h}, d_expert_out_.data() + row * h, P.value(fc2_) + long(e) * f * h,
             d_act_.data() + row * f);
        row += m;
    }
    kernels::gelu_backward(pre_.data(), d_act_.data(), d_pre_.data(), long(rows) * f, s);
    row = 0;
    for (int e = 0; e < sh.experts; ++e) {
        const int m = host_counts_[e];
        if (m > 0) {
            gemm(this->blas_, s, {true, false, h, f, m}, permuted_.data() + row * h, d_pre_.data() + row * f,
                 P.grad(fc1_) + long(e) * h * f, 1.f);
            gemm(this->blas_, s, {false, true, m, h, f}, d_pre_.data() + row * f, P.value(fc1_) + long(e) * h * f,
                 d_permuted_.data() + row * h);
        }
        row += m;
    }
}

template <class T> void moe_block<T>::preprocess_backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    kernels::permute_rows_backward(d_permuted_.data(), slot_.data(), d_normed_.data(), sh.tokens(), sh.hidden, sh.top_k, s);
}

template <class T> void moe_block<T>::router_backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    const int t = sh.tokens(), h = sh.hidden;
    auto& P = this->params_;
    kernels::router_topk_backward(expert_.data(), gate_.data(), d_gate_.data(), d_logits_.data(), t, sh.experts, sh.top_k, s);
    gemm(this->blas_, s, {true, false, h, sh.experts, t}, normed_.data(), d_logits_.data(), P.grad(router_), 1.f);
    gemm(this->blas_, s, {false, true, t, h, sh.experts}, d_logits_.data(), P.value(router_), d_normed_.data(), 1.f);
    kernels::rms_norm_weight_grad(this->x_, rstd_.data(), d_normed_.data(), P.grad(norm_), t, h, s);
    kernels::rms_norm_backward(this->x_, P.value(norm_), rstd_.data(), d_normed_.data(), this->dy_, this->dx_.data(), t, h, s);
}

// ---- Mamba-style: y = x + Wout . (scan(Win . rmsnorm(x))) ----------------------------------
template <class T>
mamba_block<T>::mamba_block(const block_shape& sh, parameter_store<T>& params, const capscope::cuda::blas_handle& blas,
                            std::string name, int layer)
    : block<T>(sh, params, blas, std::move(name), layer),
      norm_(params.declare(this->name_ + ".norm", sh.hidden, init_kind::ones)),
      in_proj_(params.declare(this->name_ + ".in_proj", n_elems(sh.hidden, 3 * sh.inner), init_kind::normal, sh.init_stddev)),
      out_proj_(params.declare(this->name_ + ".out_proj", n_elems(sh.inner, sh.hidden), init_kind::normal, sh.init_stddev)),
      rstd_(sh.tokens()), state_(n_elems(sh.tokens(), sh.inner)), normed_(n_elems(sh.tokens(), sh.hidden)),
      proj_(n_elems(sh.tokens(), 3 * sh.inner)), mixed_(n_elems(sh.tokens(), sh.inner)),
      d_mixed_(this->grad_scratch(n_elems(sh.tokens(), sh.inner))), d_proj_(this->grad_scratch(n_elems(sh.tokens(), 3 * sh.inner))),
      d_normed_(this->grad_scratch(n_elems(sh.tokens(), sh.hidden))) {}

template <class T> void mamba_block<T>::bind(const T* x, const T* dy) {
    this->x_ = x;
    this->dy_ = dy;
    for (scratch<T>* d : {&d_mixed_, &d_proj_, &d_normed_}) this->resolve(*d);
    stage st = this->make_stage("mamba", stage_kind::mamba, {capture_module::mamba}, stream_fn::of<&mamba_block::forward>(this),
                                stream_fn::of<&mamba_block::backward>(this));
    st.outputs = {this->output_ref()};
    this->stages_ = {std::move(st)};
}

template <class T> std::vector<stage> mamba_block<T>::forward_stages(token_grid g) {
    return {this->grid_stage("mamba", stage_kind::mamba, {capture_module::mamba},
                             this->template on_grid<mamba_block, &mamba_block::forward_grid>(g), g)};
}

template <class T> void mamba_block<T>::forward_grid(cudaStream_t s, token_grid g) {
    const auto& sh = this->shape_;
    const int t = g.tokens(), h = sh.hidden, d = sh.inner;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), t, h, s);
    gemm(this->blas_, s, {false, false, t, 3 * d, h}, normed_.data(), P.value(in_proj_), proj_.data());
    kernels::gated_scan_forward(proj_.data(), state_.data(), mixed_.data(), g.batch, g.seq, d, s);
    copy_rows(this->y_.data(), this->x_, n_elems(t, h), s);
    gemm(this->blas_, s, {false, false, t, h, d}, mixed_.data(), P.value(out_proj_), this->y_.data(), 1.f);
}

template <class T> void mamba_block<T>::backward(cudaStream_t s) {
    const auto& sh = this->shape_;
    const int t = sh.tokens(), h = sh.hidden, d = sh.inner;
    auto& P = this->params_;
    const T* dy = this->dy_;
    gemm(this->blas_, s, {true, false, d, h, t}, mixed_.data(), dy, P.grad(out_proj_), 1.f);
    gemm(this->blas_, s, {false, true, t, d, h}, dy, P.value(out_proj_), d_mixed_.data());
    kernels::gated_scan_backward(proj_.data(), state_.data(), d_mixed_.data(), d_proj_.data(), sh.batch, sh.seq, d, s);
    gemm(this->blas_, s, {true, false, h, 3 * d, t}, normed_.data(), d_proj_.data(), P.grad(in_proj_), 1.f);
    gemm(this->blas_, s, {false, true, t, h, 3 * d}, d_proj_.data(), P.value(in_proj_), d_normed_.data());
    kernels::rms_norm_weight_grad(this->x_, rstd_.data(), d_normed_.data(), P.grad(norm_), t, h, s);
    kernels::rms_norm_backward(this->x_, P.value(norm_), rstd_.data(), d_normed_.data(), dy, this->dx_.data(), t, h, s);
}

template class attention_block<float>;
template class attention_block<__nv_bfloat16>;
template class attention_block<__half>;
template class mlp_block<float>;
template class mlp_block<__nv_bfloat16>;
template class mlp_block<__half>;
template class moe_block<float>;
template class moe_block<__nv_bfloat16>;
template class moe_block<__half>;
template class mamba_block<float>;
template class mamba_block<__nv_bfloat16>;
template class mamba_block<__half>;

} // namespace gpt
