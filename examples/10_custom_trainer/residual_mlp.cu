#include "residual_mlp.hpp"

#include "../common/residual_kernels.cuh"

#include <capscope/cuda/error.hpp>

#include <random>

namespace custom {
using namespace residual_kernels;

residual_mlp::residual_mlp(const shape& sh, cudaStream_t s)
    : sh_(sh), params_(std::size_t(sh.blocks) * 2 * sh.features * sh.hidden), grads_(params_.size()),
      xs_(std::size_t(sh.blocks + 1) * sh.rows * sh.features), dxs_(xs_.size()), pres_(std::size_t(sh.blocks) * sh.rows * sh.hidden),
      hs_(pres_.size()), dh_(std::size_t(sh.rows) * sh.hidden), dpre_(dh_.size()), target_(std::size_t(sh.rows) * sh.features), loss_(1),
      lr_(1) {
    std::mt19937_64 rng(sh.seed);
    params_.copy_from_host(normal(params_.size(), 0.02f, rng), s);
    const auto input = normal(std::size_t(sh.rows) * sh.features, 1.f, rng);
    CAPSCOPE_CHECK(cudaMemcpyAsync(x(0), input.data(), input.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    target_.copy_from_host(normal(target_.size(), 1.f, rng), s);
    const float lr[] = {sh.lr};
    lr_.copy_from_host(lr, s);
    for (int l = 0; l < sh.blocks; ++l) fns_.push_back({this, l});
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors above go out of scope
}

void residual_mlp::block_fns::up_forward(cudaStream_t s) {
    const shape& d = m->sh_;
    gemm(m->blas_, s, false, false, d.rows, d.hidden, d.features, m->x(l), m->w1(l), m->pre(l));
    relu_forward_k<<<blocks(long(d.rows) * d.hidden), 256, 0, s>>>(m->pre(l), m->h(l), long(d.rows) * d.hidden);
    CAPSCOPE_CHECK_LAUNCH("relu_forward_k");
}
void residual_mlp::block_fns::down_forward(cudaStream_t s) {
    const shape& d = m->sh_;
    CAPSCOPE_CHECK(cudaMemcpyAsync(m->x(l + 1), m->x(l), std::size_t(d.rows) * d.features * sizeof(float), cudaMemcpyDeviceToDevice, s));
    gemm(m->blas_, s, false, false, d.rows, d.features, d.hidden, m->h(l), m->w2(l), m->x(l + 1), 1.f);
}
void residual_mlp::block_fns::down_backward(cudaStream_t s) {
    const shape& d = m->sh_;
    const float* dy = m->dx(l + 1);
    gemm(m->blas_, s, true, false, d.hidden, d.features, d.rows, m->h(l), dy, m->g2(l), 1.f); // dW2 += h^T dy
    gemm(m->blas_, s, false, true, d.rows, d.hidden, d.features, dy, m->w2(l), m->dh_.data()); // dh = dy W2^T
    // The residual path: d x(l) starts as dy; up's backward adds its branch.
    CAPSCOPE_CHECK(cudaMemcpyAsync(m->dx(l), dy, std::size_t(d.rows) * d.features * sizeof(float), cudaMemcpyDeviceToDevice, s));
}
void residual_mlp::block_fns::up_backward(cudaStream_t s) {
    const shape& d = m->sh_;
    relu_backward_k<<<blocks(long(d.rows) * d.hidden), 256, 0, s>>>(m->pre(l), m->dh_.data(), m->dpre_.data(), long(d.rows) * d.hidden);
    CAPSCOPE_CHECK_LAUNCH("relu_backward_k");
    gemm(m->blas_, s, true, false, d.features, d.hidden, d.rows, m->x(l), m->dpre_.data(), m->g1(l), 1.f); // dW1 += x^T dpre
    gemm(m->blas_, s, false, true, d.rows, d.features, d.hidden, m->dpre_.data(), m->w1(l), m->dx(l), 1.f); // dx += dpre W1^T
}

void residual_mlp::zero_grads(cudaStream_t s) { CAPSCOPE_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), s)); }
void residual_mlp::loss_forward(cudaStream_t s) {
    const long n = long(sh_.rows) * sh_.features;
    mse_k<<<1, 256, 0, s>>>(x(sh_.blocks), target_.data(), dx(sh_.blocks), loss_.data(), n);
    CAPSCOPE_CHECK_LAUNCH("mse_k");
}
void residual_mlp::sgd(cudaStream_t s) {
    sgd_k<<<blocks(long(params_.size())), 256, 0, s>>>(params_.data(), grads_.data(), lr_.data(), long(params_.size()));
    CAPSCOPE_CHECK_LAUNCH("sgd_k");
}

capscope::training_program residual_mlp::training_program() {
    using capscope::stage;
    using capscope::stream_fn;
    capscope::training_program p;
    stage zero;
    zero.name = "zero_grads";
    zero.forward = stream_fn::of<&residual_mlp::zero_grads>(this);
    zero.buffers_declared = true;
    p.step_begin.push_back(zero);
    p.microbatches.emplace_back();
    for (int l = 0; l < sh_.blocks; ++l) {
        // [snippet stages]
        const std::string b = "block" + std::to_string(l);
        block_fns* f = &fns_[std::size_t(l)];
        // stage_decl::make: kind, regions and facts as the schema declares them.
        stage up = up_part::make(b + ".up", l, stream_fn::of<&block_fns::up_forward>(f), stream_fn::of<&block_fns::up_backward>(f));
        stage down = down_part::make(b + ".down", l, stream_fn::of<&block_fns::down_forward>(f), stream_fn::of<&block_fns::down_backward>(f));
        up.buffers_declared = down.buffers_declared = true; // one set of buffers, bound for the program's life
        // [snippet stages]
        p.microbatches[0].push_back(std::move(up));
        p.microbatches[0].push_back(std::move(down));
    }
    stage loss;
    loss.name = "loss";
    loss.kind = capscope::stage_kind::head;
    loss.forward = stream_fn::of<&residual_mlp::loss_forward>(this); // writes the output gradient too: no backward
    loss.buffers_declared = true;
    p.microbatches[0].push_back(loss);
    stage opt;
    opt.name = "sgd";
    opt.kind = capscope::stage_kind::optimizer;
    opt.forward = stream_fn::of<&residual_mlp::sgd>(this);
    opt.buffers_declared = true;
    p.step_end.push_back(opt);
    return p;
}

void residual_mlp::step_by_hand(cudaStream_t s) {
    zero_grads(s);
    for (auto& f : fns_) {
        f.up_forward(s);
        f.down_forward(s);
    }
    loss_forward(s);
    for (auto it = fns_.rbegin(); it != fns_.rend(); ++it) {
        it->down_backward(s);
        it->up_backward(s);
    }
    sgd(s);
}

float residual_mlp::loss(cudaStream_t s) const {
    float v = 0;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&v, loss_.data(), sizeof v, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return v;
}
std::vector<float> residual_mlp::weights(cudaStream_t s) const {
    std::vector<float> w(params_.size());
    params_.copy_to_host(w, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return w;
}

} // namespace custom
