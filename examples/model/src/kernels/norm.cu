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
// The forward, one warp per row, when a row is whole 16-byte packs and fits V packs per lane: the
// row is read once into registers (16 bytes a load), its sum of squares reduced within the warp (a
// fixed butterfly, so deterministic), and written from the registers. No block barrier, and 8
// rows per block of 256 threads.
constexpr int norm_warps = 8;
template <class T, int V>
__global__ void __launch_bounds__(32 * norm_warps) rms_norm_forward_warp_k(const T* x, const T* g, T* y, float* rstd, int rows, int cols) {
    constexpr int W = lanes_of<T>;
    const int row = blockIdx.x * norm_warps + int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
    if (row >= rows) return; // a whole warp leaves together
    const auto* xr = reinterpret_cast<const pack<T, W>*>(x + long(row) * cols);
    const int packs = cols / W;
    pack<T, W> v[V];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int p = k * 32 + lane;
        if (p < packs) {
            v[k] = xr[p];
#pragma unroll
            for (int e = 0; e < W; ++e) ss += to_f(v[k].e[e]) * to_f(v[k].e[e]);
        }
    }
    const float r = rsqrtf(warp_sum(ss) / cols + norm_eps);
    const auto* gp = reinterpret_cast<const pack<T, W>*>(g);
    auto* yr = reinterpret_cast<pack<T, W>*>(y + long(row) * cols);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int p = k * 32 + lane;
        if (p < packs) {
            const pack<T, W> gk = gp[p];
            pack<T, W> out;
#pragma unroll
            for (int e = 0; e < W; ++e) out.e[e] = from_f<T>(to_f(v[k].e[e]) * r * to_f(gk.e[e]));
            yr[p] = out;
        }
    }
    if (lane == 0) rstd[row] = r;
}
// Packs per lane for the warp-per-row kernel, or 0 when the block-per-row kernel must run (a row
// that is not whole packs, addresses off 16 bytes, or a row past 16 packs per lane).
template <class T> int packs_per_lane(int cols, std::initializer_list<const void*> ptrs) {
    constexpr int W = lanes_of<T>;
    if (cols % W != 0 || !aligned16(ptrs)) return 0;
    const int need = (cols / W + 31) / 32;
    for (int v : {1, 2, 4, 8, 16})
        if (need <= v) return v;
    return 0;
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
    if (rows == 0) return;
    const unsigned blocks = blocks_for(rows, norm_warps), threads = 32 * norm_warps;
    switch (packs_per_lane<T>(cols, {x, g, y})) {
    case 1: rms_norm_forward_warp_k<T, 1><<<blocks, threads, 0, s>>>(x, g, y, rstd, rows, cols); break;
    case 2: rms_norm_forward_warp_k<T, 2><<<blocks, threads, 0, s>>>(x, g, y, rstd, rows, cols); break;
    case 4: rms_norm_forward_warp_k<T, 4><<<blocks, threads, 0, s>>>(x, g, y, rstd, rows, cols); break;
    case 8: rms_norm_forward_warp_k<T, 8><<<blocks, threads, 0, s>>>(x, g, y, rstd, rows, cols); break;
    case 16: rms_norm_forward_warp_k<T, 16><<<blocks, threads, 0, s>>>(x, g, y, rstd, rows, cols); break;
    default: rms_norm_forward_k<<<rows, row_threads, 0, s>>>(x, g, y, rstd, cols);
    }
    CHECKED("rms_norm_forward");
}
template <class T>
void rms_norm_backward(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx, int rows, int cols,
                       cudaStream_t s) {
    // One block per row: a warp-per-row backward that kept x and dy in registers measured slower
    // under ncu at h2048 (458 against 441 us a step), so the backward keeps this kernel.
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
INSTANTIATE(__half)

} // namespace gpt::kernels
