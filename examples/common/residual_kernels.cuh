#pragma once
// The kernels and helpers the two trainers of their own share (tutorials 10 and 11): ReLU, a
// deterministic MSE loss, SGD reading its learning rate from device memory, row-major GEMM
// through cuBLAS, and normal-distributed initial values. fp32, one thread per element.

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/error.hpp>

#include <random>
#include <vector>

namespace residual_kernels {
namespace {

__global__ void relu_forward_k(const float* pre, float* h, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) h[i] = pre[i] > 0.f ? pre[i] : 0.f;
}
__global__ void relu_backward_k(const float* pre, const float* dh, float* dpre, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) dpre[i] = pre[i] > 0.f ? dh[i] : 0.f;
}
// One block, fixed order: the loss is a deterministic sum; d = 2 (y - t) / n for every element.
__global__ void mse_k(const float* y, const float* t, float* d, float* loss, long n) {
    __shared__ float part[256];
    float sum = 0.f;
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = y[i] - t[i];
        sum += e * e;
        d[i] = 2.f * e / float(n);
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = part[0] / float(n);
}
// The learning rate is read from device memory: a host value here would freeze in a graph (rule P8).
__global__ void sgd_k(float* w, const float* g, const float* lr, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) w[i] -= *lr * g[i];
}
unsigned blocks(long n) { return unsigned((n + 255) / 256); }

//! Row-major C[M,N] = op(A) op(B) + beta C through column-major cuBLAS (C^T = op(B)^T op(A)^T).
void gemm(const capscope::cuda::blas_handle& blas, cudaStream_t s, bool ta, bool tb, int M, int N, int K, const float* A, const float* B,
          float* C, float beta = 0.f) {
    const float alpha = 1.f;
    CAPSCOPE_CHECK(cublasSgemm(blas.on(s), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, tb ? K : N,
                               A, ta ? M : K, &beta, C, N));
}

std::vector<float> normal(std::size_t n, float stddev, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.f, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}
} // namespace
} // namespace residual_kernels
