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

__global__ void load_kernel(const float* pool, const int* counter, float* dst, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = pool[static_cast<long long>(*counter) * n + i];
}
__global__ void advance_kernel(int* counter) { *counter += 1; }
__global__ void burn_kernel(float* x, int n, int iterations) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int k = 0; k < iterations; ++k) v = fmaf(v, 0.999f, 0.001f);
    x[i] = v;
}
__global__ void half_square_kernel(const float* y, double* total, int n) {
    __shared__ double part[block];
    double sum = 0;
    for (int i = threadIdx.x; i < n; i += block) sum += 0.5 * double(y[i]) * double(y[i]);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = block / 2; half > 0; half /= 2) {
        if (int(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) *total += part[0];
}
__global__ void spin_kernel(long long ns) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    while (static_cast<long long>(now - start) < ns);
}

} // namespace

void load_next(const float* pool, int* counter, float* dst, int n, cudaStream_t s) {
    load_kernel<<<blocks(n), block, 0, s>>>(pool, counter, dst, n);
    CAPSCOPE_CHECK_LAUNCH("pipeline load");
    advance_kernel<<<1, 1, 0, s>>>(counter); // after every thread of the load has read it
    CAPSCOPE_CHECK_LAUNCH("pipeline load counter");
}
void burn(float* scratch, int n, int iterations, cudaStream_t s) {
    burn_kernel<<<blocks(n), block, 0, s>>>(scratch, n, iterations);
    CAPSCOPE_CHECK_LAUNCH("pipeline burn");
}
void spin(long long ns, cudaStream_t s) {
    spin_kernel<<<1, 1, 0, s>>>(ns);
    CAPSCOPE_CHECK_LAUNCH("pipeline spin");
}

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
void add_half_square(const float* y, double* total, int n, cudaStream_t s) {
    half_square_kernel<<<1, block, 0, s>>>(y, total, n);
    CAPSCOPE_CHECK_LAUNCH("pipeline loss");
}
void sgd(float* w, float* dw, float lr, int n, cudaStream_t s) {
    sgd_kernel<<<blocks(n), block, 0, s>>>(w, dw, lr, n);
    CAPSCOPE_CHECK_LAUNCH("pipeline sgd");
}

} // namespace pipeline_kernels
