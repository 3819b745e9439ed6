// Elementwise kernels: precision casts, GELU (tanh form), and the AdamW update.

#include "common.cuh"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace gpt::kernels {
namespace {
using namespace detail;

// ---- elementwise ---------------------------------------------------------------------------
template <class T> __global__ void cast_from_float_k(const float* in, T* out, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) out[i] = from_f<T>(in[i]);
}

template <class T> __global__ void cast_to_float_k(const T* in, float* out, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) out[i] = to_f(in[i]);
}
template <class T> __global__ void zero_padded_rows_k(T* x, const int* valid_samples, int rows_per_sample, long n, int cols) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n && i / cols >= long(*valid_samples) * rows_per_sample) x[i] = from_f<T>(0.f);
}

// ---- GELU (tanh form) ----------------------------------------------------------------------
// One thread per 16 bytes (8 bf16 or fp16, or 4 floats) when the sizes and addresses allow, so each warp
// keeps 512 bytes of loads in flight; one element per thread otherwise.
constexpr float gelu_k0 = 0.7978845608028654f, gelu_k1 = 0.044715f;
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + tanhf(gelu_k0 * (v + gelu_k1 * v * v * v))); }
__device__ __forceinline__ float gelu_grad(float v) {
    const float t = tanhf(gelu_k0 * (v + gelu_k1 * v * v * v));
    return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * gelu_k0 * (1.f + 3.f * gelu_k1 * v * v);
}
template <class T, int W> __global__ void gelu_forward_k(const T* x, T* y, long n) {
    const long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i * W >= n) return;
    pack<T, W> a = reinterpret_cast<const pack<T, W>*>(x)[i];
#pragma unroll
    for (int k = 0; k < W; ++k) a.e[k] = from_f<T>(gelu(to_f(a.e[k])));
    reinterpret_cast<pack<T, W>*>(y)[i] = a;
}
template <class T, int W> __global__ void gelu_backward_k(const T* x, const T* dy, T* dx, long n) {
    const long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i * W >= n) return;
    const pack<T, W> a = reinterpret_cast<const pack<T, W>*>(x)[i], g = reinterpret_cast<const pack<T, W>*>(dy)[i];
    pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.e[k] = from_f<T>(gelu_grad(to_f(a.e[k])) * to_f(g.e[k]));
    reinterpret_cast<pack<T, W>*>(dx)[i] = out;
}

// ---- dropout: a counter-based generator (splitmix64 of seed, offset and element) -------------
__device__ inline float uniform_of(std::uint64_t seed, std::uint64_t offset, long i) {
    std::uint64_t z = seed ^ (offset * 0x9e3779b97f4a7c15ull) ^ (std::uint64_t(i) * 0xbf58476d1ce4e5b9ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(z >> 40) * (1.f / 16777216.f); // 24 bits: [0, 1)
}
template <class T>
__global__ void dropout_add_k(const T* z, const T* x, T* y, unsigned char* mask, const rng_state* rng, float p, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const bool keep = uniform_of(rng->seed, rng->offset, i) >= p;
    mask[i] = keep;
    y[i] = from_f<T>(to_f(x[i]) + (keep ? to_f(z[i]) / (1.f - p) : 0.f));
}
__global__ void advance_rng_k(rng_state* rng) { rng->offset += 1; }
__global__ void set_rng_k(rng_state* rng, std::uint64_t seed, std::uint64_t offset) {
    rng->seed = seed;
    rng->offset = offset;
}
template <class T> __global__ void dropout_backward_k(const T* dy, const unsigned char* mask, T* dz, float p, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) dz[i] = from_f<T>(mask[i] ? to_f(dy[i]) / (1.f - p) : 0.f);
}

// ---- AdamW ---------------------------------------------------------------------------------
__global__ void advance_step_k(int* step) { ++*step; }
// The hyperparameters are read from device memory, so a captured step follows a schedule.
__global__ void set_hyperparameters_k(adamw_hyperparameters* dst, adamw_hyperparameters values) { *dst = values; }
template <class T>
__global__ void adamw_k(float* master, T* param, const float* grad, float* m, float* v, long n, const int* step,
                        const adamw_hyperparameters* hyper, const float* inverse_loss_scale) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const adamw_hyperparameters h = *hyper;
    const float bc1 = 1.f - powf(h.beta1, float(*step)), bc2 = 1.f - powf(h.beta2, float(*step));
    // Times the scale's exact inverse: the same bits as a division by the scale, for less work.
    const float g = inverse_loss_scale ? grad[i] * *inverse_loss_scale : grad[i];
    const float mi = h.beta1 * m[i] + (1.f - h.beta1) * g;
    const float vi = h.beta2 * v[i] + (1.f - h.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float w = master[i] - h.lr * ((mi / bc1) / (sqrtf(vi / bc2) + h.eps) + h.weight_decay * master[i]);
    master[i] = w;
    param[i] = from_f<T>(w);
}

// ---- the finite check ---------------------------------------------------------------------
__global__ void set_int_k(int* x, int value) { *x = value; }
// A float is finite when its exponent bits are not all ones; OR-ing the "all ones" tests of 16
// bytes at a time keeps the pass at the memory's rate (it reads every gradient once).
__device__ __forceinline__ bool not_finite_bits(unsigned u) { return (u & 0x7f800000u) == 0x7f800000u; }
__global__ void clear_unless_finite_k(const float* x, long n, int* flag) {
    bool bad = false;
    const long stride = long(gridDim.x) * blockDim.x, first = blockIdx.x * long(blockDim.x) + threadIdx.x;
    const long n4 = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 ? n / 4 : 0;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    for (long i = first; i < n4; i += stride) {
        const uint4 v = x4[i];
        bad = bad || not_finite_bits(v.x) || not_finite_bits(v.y) || not_finite_bits(v.z) || not_finite_bits(v.w);
    }
    for (long i = 4 * n4 + first; i < n; i += stride) bad = bad || not_finite_bits(__float_as_uint(x[i]));
    if (bad) *flag = 0;
}
__global__ void count_if_cleared_k(const int* flag, int* count) { *count += *flag == 0; }
__global__ void set_loss_scale_k(loss_scale_state* st, float scale) { *st = {scale, 1.f / scale, 0}; }
__global__ void update_loss_scale_k(const int* all_finite, loss_scale_state* st, int growth_interval) {
    float scale = st->scale;
    if (*all_finite == 0) scale = fmaxf(scale * 0.5f, loss_scale_state::smallest);
    else if (++st->clean_steps < growth_interval) return;
    else scale = fminf(scale * 2.f, loss_scale_state::largest);
    *st = {scale, 1.f / scale, 0};
}
__global__ void update_gate_k(const int* overflow, const int* all_finite, int* may_update) {
    *may_update = *overflow == 0 && (all_finite == nullptr || *all_finite != 0);
}

} // namespace

void update_loss_scale(const int* all_finite, loss_scale_state* state, int growth_interval, cudaStream_t s) {
    update_loss_scale_k<<<1, 1, 0, s>>>(all_finite, state, growth_interval);
    CHECKED("update_loss_scale");
}
void set_loss_scale(loss_scale_state* state, float scale, cudaStream_t s) {
    set_loss_scale_k<<<1, 1, 0, s>>>(state, scale);
    CHECKED("set_loss_scale");
}
void update_gate(const int* overflow, const int* all_finite, int* may_update, cudaStream_t s) {
    update_gate_k<<<1, 1, 0, s>>>(overflow, all_finite, may_update);
    CHECKED("update_gate");
}
void set_int(int* x, int value, cudaStream_t s) {
    set_int_k<<<1, 1, 0, s>>>(x, value);
    CHECKED("set_int");
}
// ---- a pipeline chunk's microbatch, by a device counter --------------------------------------
__global__ void copy_row_at_k(const int* rows, const int* index, int count, int* dst, int n, int* overrun) {
    const int at = *index;
    if (at < 0 || at >= count) {
        if (blockIdx.x == 0 && threadIdx.x == 0) *overrun = 1;
        return;
    }
    const long row = long(at) * n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = rows[row + i];
}
__global__ void store_at_k(const float* value, const int* index, int count, float* dst, int* overrun) {
    const int at = *index;
    if (at < 0 || at >= count) *overrun = 1;
    else dst[at] = *value;
}
__global__ void increment_k(int* x) { *x += 1; }
void copy_row_at(const int* rows, const int* index, int count, int* dst, int n, int* overrun, cudaStream_t s) {
    copy_row_at_k<<<int(std::min<long>(blocks_for(n, elt_threads), 1024)), elt_threads, 0, s>>>(rows, index, count, dst, n, overrun);
    CHECKED("copy_row_at");
}
void store_at(const float* value, const int* index, int count, float* dst, int* overrun, cudaStream_t s) {
    store_at_k<<<1, 1, 0, s>>>(value, index, count, dst, overrun);
    CHECKED("store_at");
}
__global__ void set_float_k(float* x, float value) { *x = value; }
void set_float(float* x, float value, cudaStream_t s) {
    set_float_k<<<1, 1, 0, s>>>(x, value);
    CHECKED("set_float");
}
void increment(int* x, cudaStream_t s) {
    increment_k<<<1, 1, 0, s>>>(x);
    CHECKED("increment");
}
void clear_unless_finite(const float* x, long n, int* flag, cudaStream_t s) {
    const int grid = int(std::min<long>(blocks_for((n + 3) / 4, elt_threads), 2048)); // grid-stride: a few waves at most
    clear_unless_finite_k<<<grid, elt_threads, 0, s>>>(x, n, flag);
    CHECKED("clear_unless_finite");
}
void count_if_cleared(const int* flag, int* count, cudaStream_t s) {
    count_if_cleared_k<<<1, 1, 0, s>>>(flag, count);
    CHECKED("count_if_cleared");
}

template <class T> void cast_from_float(const float* in, T* out, long n, cudaStream_t s) {
    if (n == 0) return;
    cast_from_float_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(in, out, n);
    CHECKED("cast_from_float");
}
template <class T> void cast_to_float(const T* in, float* out, long n, cudaStream_t s) {
    if (n == 0) return;
    cast_to_float_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(in, out, n);
    CHECKED("cast_to_float");
}
template <class T> void zero_padded_rows(T* x, const int* valid_samples, int rows_per_sample, int rows, int cols, cudaStream_t s) {
    const long n = long(rows) * cols;
    zero_padded_rows_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, valid_samples, rows_per_sample, n, cols);
    CHECKED("zero_padded_rows");
}
template <class T> void gelu_forward(const T* x, T* y, long n, cudaStream_t s) {
    constexpr int W = lanes_of<T>;
    if (n % W == 0 && aligned16({x, y})) gelu_forward_k<T, W><<<blocks_for(n / W, elt_threads), elt_threads, 0, s>>>(x, y, n);
    else gelu_forward_k<T, 1><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, y, n);
    CHECKED("gelu_forward");
}
template <class T> void gelu_backward(const T* x, const T* dy, T* dx, long n, cudaStream_t s) {
    constexpr int W = lanes_of<T>;
    if (n % W == 0 && aligned16({x, dy, dx})) gelu_backward_k<T, W><<<blocks_for(n / W, elt_threads), elt_threads, 0, s>>>(x, dy, dx, n);
    else gelu_backward_k<T, 1><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, dy, dx, n);
    CHECKED("gelu_backward");
}
template <class T>
void dropout_add_forward(const T* z, const T* x, T* y, unsigned char* mask, rng_state* rng, float p, long n, cudaStream_t s) {
    dropout_add_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(z, x, y, mask, rng, p, n);
    CHECKED("dropout_add_forward");
    advance_rng_k<<<1, 1, 0, s>>>(rng);
    CHECKED("advance_rng");
}
template <class T> void dropout_backward(const T* dy, const unsigned char* mask, T* dz, float p, long n, cudaStream_t s) {
    dropout_backward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(dy, mask, dz, p, n);
    CHECKED("dropout_backward");
}
void set_rng(rng_state* device, std::uint64_t seed, std::uint64_t offset, cudaStream_t s) {
    set_rng_k<<<1, 1, 0, s>>>(device, seed, offset);
    CHECKED("set_rng");
}
void set_adamw_hyperparameters(adamw_hyperparameters* device, const adamw_hyperparameters& values, cudaStream_t s) {
    set_hyperparameters_k<<<1, 1, 0, s>>>(device, values);
    CHECKED("set_adamw_hyperparameters");
}
template <class T>
void adamw(float* master, T* param, const float* grad, float* m, float* v, long n, int* step, const adamw_hyperparameters* hyper,
           cudaStream_t s, bool advance_step, const float* inverse_loss_scale) {
    if (advance_step) {
        advance_step_k<<<1, 1, 0, s>>>(step);
        CHECKED("advance_step");
    }
    adamw_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(master, param, grad, m, v, n, step, hyper, inverse_loss_scale);
    CHECKED("adamw");
}

#define INSTANTIATE(T) \
    template void cast_from_float<T>(const float*, T*, long, cudaStream_t); \
    template void cast_to_float<T>(const T*, float*, long, cudaStream_t); \
    template void zero_padded_rows<T>(T*, const int*, int, int, int, cudaStream_t); \
    template void gelu_forward<T>(const T*, T*, long, cudaStream_t); \
    template void gelu_backward<T>(const T*, const T*, T*, long, cudaStream_t); \
    template void dropout_add_forward<T>(const T*, const T*, T*, unsigned char*, rng_state*, float, long, cudaStream_t); \
    template void dropout_backward<T>(const T*, const unsigned char*, T*, float, long, cudaStream_t); \
    template void adamw<T>(float*, T*, const float*, float*, float*, long, int*, const adamw_hyperparameters*, cudaStream_t, bool, const float*);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
INSTANTIATE(__half)

} // namespace gpt::kernels
