// RMSNorm forward, backward and gain gradient.

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

constexpr float norm_eps = 1e-5f;

template <class T> __global__ void rms_norm_forward_k(const T* x, const T* g, T* y, float* rstd, int cols) {
    const long row = blockIdx.x;
    const T* xr = x + row * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += to_f(xr[c]) * to_f(xr[c]);
    const float r = rsqrtf(block_sum(ss) / cols + norm_eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = from_f<T>(to_f(xr[c]) * r * to_f(g[c]));
    if (threadIdx.x == 0) rstd[row] = r;
}
template <class T>
__global__ void rms_norm_backward_k(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx,
                                    int cols) {
    const long row = blockIdx.x;
    const long base = row * cols;
    float dot = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dot += to_f(dy[base + c]) * to_f(g[c]) * to_f(x[base + c]);
    dot = block_sum(dot);
    const float r = rstd[row];
    const float k = r * r * r * dot / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = r * to_f(g[c]) * to_f(dy[base + c]) - to_f(x[base + c]) * k;
        if (residual_grad) v += to_f(residual_grad[base + c]);
        dx[base + c] = from_f<T>(v);
    }
}
// dg[c] += sum_r dy[r, c] x[r, c] rstd[r]. A block owns 32 columns (one per lane, so a warp
// reads 32 adjacent elements of a row) and 32 warps split the rows; the 32 partial sums of each
// column are then added in a fixed order, so the result does not depend on scheduling.
constexpr int weight_grad_rows = 32;
template <class T> __global__ void __launch_bounds__(32 * weight_grad_rows)
    rms_norm_weight_grad_k(const T* x, const float* rstd, const T* dy, float* dg, int rows, int cols) {
    __shared__ float part[weight_grad_rows][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.f;
    if (c < cols) {
        int r = threadIdx.y;
        // Four rows per pass: eight loads in flight before the first is used.
        for (; r + 3 * weight_grad_rows < rows; r += 4 * weight_grad_rows) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const long at = long(r + u * weight_grad_rows) * cols + c;
                v[u] = to_f(dy[at]) * to_f(x[at]) * rstd[r + u * weight_grad_rows];
            }
            acc += (v[0] + v[1]) + (v[2] + v[3]);
        }
        for (; r < rows; r += weight_grad_rows) acc += to_f(dy[long(r) * cols + c]) * to_f(x[long(r) * cols + c]) * rstd[r];
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float sum = 0.f;
        for (int w = 0; w < weight_grad_rows; ++w) sum += part[w][threadIdx.x];
        dg[c] += sum; // gradients accumulate over microbatches; zero_grad clears them
    }
}

} // namespace

template <class T> void rms_norm_forward(const T* x, const T* g, T* y, float* rstd, int rows, int cols, cudaStream_t s) {
    rms_norm_forward_k<<<rows, row_threads, 0, s>>>(x, g, y, rstd, cols);
    CHECKED("rms_norm_forward");
}
template <class T>
void rms_norm_backward(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx, int rows, int cols,
                       cudaStream_t s) {
    rms_norm_backward_k<<<rows, row_threads, 0, s>>>(x, g, rstd, dy, residual_grad, dx, cols);
    CHECKED("rms_norm_backward");
}
template <class T> void rms_norm_weight_grad(const T* x, const float* rstd, const T* dy, float* dg, int rows, int cols, cudaStream_t s) {
    rms_norm_weight_grad_k<<<blocks_for(cols, 32), dim3(32, weight_grad_rows), 0, s>>>(x, rstd, dy, dg, rows, cols);
    CHECKED("rms_norm_weight_grad");
}

#define INSTANTIATE(T) \
    template void rms_norm_forward<T>(const T*, const T*, T*, float*, int, int, cudaStream_t); \
    template void rms_norm_backward<T>(const T*, const T*, const float*, const T*, const T*, T*, int, int, cudaStream_t); \
    template void rms_norm_weight_grad<T>(const T*, const float*, const T*, float*, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)

} // namespace gpt::kernels
