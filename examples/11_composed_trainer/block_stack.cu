#include "block_stack.hpp"

#include "../common/residual_kernels.cuh"

#include <capscope/cuda/error.hpp>

#include <random>
#include <string>

namespace composed {
using namespace residual_kernels;
namespace {
__global__ void clamp_k(float* g, float c, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) g[i] = fminf(fmaxf(g[i], -c), c);
}
} // namespace

block_stack::block_stack(const shape& sh, const capscope::offload_settings& policy, cudaStream_t s)
    : sh_(sh), master_(std::size_t(sh.blocks) * 2 * sh.features * sh.hidden), params_(master_.size()), grads_(master_.size()),
      xs_(std::size_t(sh.blocks + 1) * sh.rows * sh.features), dxs_(xs_.size()), dh_(std::size_t(sh.rows) * sh.hidden), dpre_(dh_.size()),
      target_(std::size_t(sh.rows) * sh.features), loss_(1), lr_(1) {
    // [snippet store]
    // The activations each block keeps, under the trainer's own names.
    for (int l = 0; l < sh.blocks; ++l) {
        const std::string b = "block" + std::to_string(l);
        pre_ids_.push_back(store_.declare(l, "pre_act", b + ".pre_act", row_bytes(sh.hidden), sizeof(float)));
        hidden_ids_.push_back(store_.declare(l, "hidden", b + ".hidden", row_bytes(sh.hidden), sizeof(float)));
    }
    store_.allocate(policy);
    // [snippet store]
    std::mt19937_64 rng(sh.seed);
    master_.copy_from_host(normal(master_.size(), 0.02f, rng), s);
    const auto input = normal(std::size_t(sh.rows) * sh.features, 1.f, rng);
    CAPSCOPE_CHECK(cudaMemcpyAsync(x(0), input.data(), input.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    target_.copy_from_host(normal(target_.size(), 1.f, rng), s);
    const float lr[] = {sh.lr};
    lr_.copy_from_host(lr, s);
    for (int l = 0; l < sh.blocks; ++l) fns_.push_back({this, l});
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors above go out of scope
}

void block_stack::gather(int l, cudaStream_t s) {
    CAPSCOPE_CHECK(cudaMemcpyAsync(w1(l), master_.data() + std::size_t(l) * per_block(), per_block() * sizeof(float), cudaMemcpyDeviceToDevice, s));
}
void block_stack::clip_gradients(int l, cudaStream_t s) {
    clamp_k<<<blocks(long(per_block())), 256, 0, s>>>(g1(l), sh_.clip, long(per_block()));
    CAPSCOPE_CHECK_LAUNCH("clamp_k");
}

void block_stack::block_fns::up_forward(cudaStream_t s) {
    const shape& d = m->sh_;
    gemm(m->blas_, s, false, false, d.rows, d.hidden, d.features, m->x(l), m->w1(l), m->pre(l));
    relu_forward_k<<<blocks(long(d.rows) * d.hidden), 256, 0, s>>>(m->pre(l), m->h(l), long(d.rows) * d.hidden);
    CAPSCOPE_CHECK_LAUNCH("relu_forward_k");
}
void block_stack::block_fns::down_forward(cudaStream_t s) {
    const shape& d = m->sh_;
    CAPSCOPE_CHECK(cudaMemcpyAsync(m->x(l + 1), m->x(l), m->row_bytes(d.features), cudaMemcpyDeviceToDevice, s));
    gemm(m->blas_, s, false, false, d.rows, d.features, d.hidden, m->h(l), m->w2(l), m->x(l + 1), 1.f);
}
void block_stack::block_fns::down_backward(cudaStream_t s) {
    const shape& d = m->sh_;
    const float* dy = m->dx(l + 1);
    gemm(m->blas_, s, true, false, d.hidden, d.features, d.rows, m->h(l), dy, m->g2(l), 1.f); // dW2 += h^T dy
    gemm(m->blas_, s, false, true, d.rows, d.hidden, d.features, dy, m->w2(l), m->dh_.data()); // dh = dy W2^T
    CAPSCOPE_CHECK(cudaMemcpyAsync(m->dx(l), dy, m->row_bytes(d.features), cudaMemcpyDeviceToDevice, s)); // the residual path
}
void block_stack::block_fns::up_backward(cudaStream_t s) {
    const shape& d = m->sh_;
    relu_backward_k<<<blocks(long(d.rows) * d.hidden), 256, 0, s>>>(m->pre(l), m->dh_.data(), m->dpre_.data(), long(d.rows) * d.hidden);
    CAPSCOPE_CHECK_LAUNCH("relu_backward_k");
    gemm(m->blas_, s, true, false, d.features, d.hidden, d.rows, m->x(l), m->dpre_.data(), m->g1(l), 1.f); // dW1 += x^T dpre
    gemm(m->blas_, s, false, true, d.rows, d.features, d.hidden, m->dpre_.data(), m->w1(l), m->dx(l), 1.f); // dx += dpre W1^T
}

void block_stack::zero_grads(cudaStream_t s) { CAPSCOPE_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), s)); }
void block_stack::loss_forward(cudaStream_t s) {
    const long n = long(sh_.rows) * sh_.features;
    mse_k<<<1, 256, 0, s>>>(x(sh_.blocks), target_.data(), dx(sh_.blocks), loss_.data(), n);
    CAPSCOPE_CHECK_LAUNCH("mse_k");
}
void block_stack::sgd(cudaStream_t s) {
    sgd_k<<<blocks(long(master_.size())), 256, 0, s>>>(master_.data(), grads_.data(), lr_.data(), long(master_.size()));
    CAPSCOPE_CHECK_LAUNCH("sgd_k");
}

capscope::tensor_ref block_stack::ref(const char* what, int l, float* p, std::size_t bytes) const {
    return {"block" + std::to_string(l) + "." + what, p, bytes};
}

capscope::training_program block_stack::training_program() {
    using capscope::stage;
    using capscope::stream_fn;
    capscope::training_program p;
    stage zero;
    zero.name = "zero_grads";
    zero.forward = stream_fn::of<&block_stack::zero_grads>(this);
    zero.outputs = {{"gradients", grads_.data(), grads_.bytes()}};
    zero.buffers_declared = true;
    p.step_begin.push_back(zero);
    p.microbatches.emplace_back();
    const std::size_t act = row_bytes(sh_.features), wide = row_bytes(sh_.hidden);
    for (int l = 0; l < sh_.blocks; ++l) {
        const std::string b = "block" + std::to_string(l);
        block_fns* f = &fns_[std::size_t(l)];
        // What each pass touches beyond the block's weights and gradients (the composition knows those).
        stage up = up_part::make(b + ".up", l, stream_fn::of<&block_fns::up_forward>(f), stream_fn::of<&block_fns::up_backward>(f));
        up.inputs = {ref("x", l, x(l), act)};
        up.outputs = {ref("pre_act", l, pre(l), wide), ref("hidden", l, h(l), wide)};
        up.saves = {store_.saved(pre_ids_[std::size_t(l)])};
        up.backward_inputs = {{"dh", dh_.data(), dh_.bytes()}};
        up.backward_outputs = {{"dpre", dpre_.data(), dpre_.bytes()}, ref("dx", l, dx(l), act)};
        up.buffers_declared = true;
        stage down = down_part::make(b + ".down", l, stream_fn::of<&block_fns::down_forward>(f), stream_fn::of<&block_fns::down_backward>(f));
        down.inputs = {ref("x", l, x(l), act)};
        down.outputs = {ref("x", l + 1, x(l + 1), act)};
        down.saves = {store_.saved(hidden_ids_[std::size_t(l)])};
        down.backward_inputs = {ref("dx", l + 1, dx(l + 1), act)};
        down.backward_outputs = {{"dh", dh_.data(), dh_.bytes()}, ref("dx", l, dx(l), act)};
        down.buffers_declared = true;
        p.microbatches[0].push_back(std::move(up));
        p.microbatches[0].push_back(std::move(down));
    }
    stage loss;
    loss.name = "loss";
    loss.kind = capscope::stage_kind::head;
    loss.forward = stream_fn::of<&block_stack::loss_forward>(this); // writes the output gradient too: no backward
    loss.inputs = {ref("x", sh_.blocks, x(sh_.blocks), act), {"target", target_.data(), target_.bytes()}};
    loss.outputs = {ref("dx", sh_.blocks, dx(sh_.blocks), act), {"loss", loss_.data(), loss_.bytes()}};
    loss.buffers_declared = true;
    p.microbatches[0].push_back(loss);
    stage opt;
    opt.name = "sgd";
    opt.kind = capscope::stage_kind::optimizer;
    opt.forward = stream_fn::of<&block_stack::sgd>(this);
    opt.inputs = {{"lr", lr_.data(), lr_.bytes()}};
    opt.outputs = {{"master weights", master_.data(), master_.bytes()}};
    opt.buffers_declared = true;
    p.step_end.push_back(opt);
    return p;
}

std::vector<capscope::layer_buffers> block_stack::layer_buffers() const {
    std::vector<capscope::layer_buffers> out;
    for (int l = 0; l < sh_.blocks; ++l)
        out.push_back({{ref("weights", l, w1(l), per_block() * sizeof(float))}, {ref("gradients", l, g1(l), per_block() * sizeof(float))}});
    return out;
}

void block_stack::step_by_hand(cudaStream_t s) {
    zero_grads(s);
    for (auto& f : fns_) {
        gather(f.l, s);
        f.up_forward(s);
        f.down_forward(s);
    }
    loss_forward(s);
    for (auto it = fns_.rbegin(); it != fns_.rend(); ++it) {
        it->down_backward(s);
        it->up_backward(s);
        clip_gradients(it->l, s);
    }
    sgd(s);
}

float block_stack::loss(cudaStream_t s) const {
    float v = 0;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&v, loss_.data(), sizeof v, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return v;
}
std::vector<float> block_stack::weights(cudaStream_t s) const {
    std::vector<float> w(master_.size());
    master_.copy_to_host(w, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return w;
}

} // namespace composed
