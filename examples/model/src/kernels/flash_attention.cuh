#pragma once
// Choosing and launching a fused attention kernel: the head-dimension tile, tensor cores or the
// scalar fp32 path, shared-memory limits, and the scalar path's tile loads.

#include "flash_common.cuh"

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace gpt::kernels::detail::flash {

constexpr int scalar_keys = 32; // keys per shared-memory step of the scalar kernels

inline problem make_problem(attention_mask mask, const int* lengths, int batch, int seq, int heads, int head_dim) {
    if (head_dim < 1 || head_dim > max_head_dim)
        throw std::invalid_argument("fused attention: head_dim " + std::to_string(head_dim) + " is outside [1, " +
                                    std::to_string(max_head_dim) + "]; use more heads (narrower ones)");
    if (mask == attention_mask::key_padding && !lengths)
        throw std::invalid_argument("fused attention: key_padding needs the device array of lengths");
    return {batch, seq, heads, head_dim, log2e / std::sqrt(float(head_dim)), mask, lengths};
}

// Calls f.template operator()<DH>() with the smallest tile width that holds head_dim.
template <class F> void with_head_dim(int head_dim, F&& f) {
    if (head_dim <= 16) f.template operator()<16>();
    else if (head_dim <= 32) f.template operator()<32>();
    else if (head_dim <= 64) f.template operator()<64>();
    else f.template operator()<128>();
}

// Tensor cores: bf16 or fp16, a GPU of compute capability 8.0 or later (asked once), and rows that
// cp.async can move in 16-byte pieces (head_dim a multiple of 8).
template <class T> bool uses_tensor_cores(int head_dim) {
    if constexpr (!sixteen_bit<T>) {
        return false;
    } else {
        static const bool sm80 = [] {
            int device = 0, major = 0;
            CAPSCOPE_CHECK(cudaGetDevice(&device));
            CAPSCOPE_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
            return major >= 8;
        }();
        return sm80 && head_dim % 8 == 0;
    }
}

// A kernel may use more than 48 KB of dynamic shared memory only once it is allowed to (once).
template <auto Kernel> void allow_dynamic_smem(int bytes) {
    if (bytes <= 48 * 1024) return;
    static const bool allowed = [bytes] {
        CAPSCOPE_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        return true;
    }();
    (void)allowed;
}

// Rows [r0, r0 + scalar_keys) of a head as fp32 into shared memory, zero past `rows` and dh.
template <class T, int DH>
__device__ void load_rows_f(float (&dst)[scalar_keys][DH], const T* head, long stride, int r0, int rows, int dh) {
    for (int c = threadIdx.x; c < scalar_keys * DH; c += blockDim.x) {
        const int r = c / DH, d = c % DH;
        dst[r][d] = r0 + r < rows && d < dh ? to_f(head[long(r0 + r) * stride + d]) : 0.f;
    }
}

} // namespace gpt::kernels::detail::flash
