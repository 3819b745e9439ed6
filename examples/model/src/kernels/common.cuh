#pragma once
// What every kernel file of the model shares: float conversion of the element types, launch
// sizing, and the fixed-order (deterministic) warp and block reductions.

#include "../kernels.hpp"

#include <capscope/cuda/error.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace gpt::kernels::detail {

constexpr int row_threads = 128; // one block per row
constexpr int elt_threads = 256; // one thread per element

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

//! The 16-bit element types, which run on tensor cores.
template <class T> constexpr bool sixteen_bit = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

inline unsigned blocks_for(long n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

struct sum_op {
    static constexpr float identity = 0.f;
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
    static constexpr float identity = -INFINITY;
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <class Op> __device__ __forceinline__ float warp_reduce(float v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, sum_op{}); }

// Fixed-order block reduction; every thread gets the result. blockDim.x is a multiple of 32.
template <class Op> __device__ __forceinline__ float block_reduce(float v, Op op) {
    __shared__ float part[32];
    v = warp_reduce(v, op);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : Op::identity;
    if (warp == 0) v = warp_reduce(v, op);
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, sum_op{}); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, max_op{}); }

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

//! 16 bytes of T (8 bf16 or fp16, or 4 floats), loaded and stored as one.
template <class T> constexpr int lanes_of = 16 / int(sizeof(T));
template <class T, int W> struct alignas(sizeof(T) * W) pack {
    T e[W];
};
inline bool aligned16(std::initializer_list<const void*> ptrs) {
    for (const void* p : ptrs)
        if (reinterpret_cast<std::uintptr_t>(p) % 16) return false;
    return true;
}

} // namespace gpt::kernels::detail

#define CHECKED(name) CAPSCOPE_CHECK_LAUNCH(name)
