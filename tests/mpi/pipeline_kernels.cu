#include "pipeline_kernels.hpp"

#include <capscope/cuda/error.hpp>

namespace pipeline_kernels {
namespace {

constexpr int block = 256;
int blocks(int n) { return (n + block - 1) / block; }

__global__ void forward_kernel(const float* x, const float* w, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(x[i], w[i]), 0.25f);
}
__global__ void backward_kernel(const float* dy, const float* x, const float* w, float* dw, float* dx, int n, bool last) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = last ? __fadd_rn(__fmul_rn(x[i], w[i]), 0.25f) : dy[i];
    dw[i] = __fadd_rn(dw[i], __fmul_rn(g, x[i]));
    if (dx) dx[i] = __fmul_rn(g, w[i]);
}
__global__ void sgd_kernel(float* w, float* dw, float lr, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, dw[i]));
    dw[i] = 0.f;
}

} // namespace

void forward(const float* x, const float* w, float* y, int n, cudaStream_t s) {
    forward_kernel<<<blocks(n), block, 0, s>>>(x, w, y, n);
    CAPSCOPE_CHECK_LAUNCH("pipeline forward");
}
void backward(const float* dy, const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s) {
    backward_kernel<<<blocks(n), block, 0, s>>>(dy, x, w, dw, dx, n, false);
    CAPSCOPE_CHECK_LAUNCH("pipeline backward");
}
void last_backward(const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s) {
    backward_kernel<<<blocks(n), block, 0, s>>>(nullptr, x, w, dw, dx, n, true);
    CAPSCOPE_CHECK_LAUNCH("pipeline last backward");
}
void sgd(float* w, float* dw, float lr, int n, cudaStream_t s) {
    sgd_kernel<<<blocks(n), block, 0, s>>>(w, dw, lr, n);
    CAPSCOPE_CHECK_LAUNCH("pipeline sgd");
}

} // namespace pipeline_kernels
