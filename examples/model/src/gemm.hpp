#pragma once
// Row-major GEMMs on cuBLAS (which is column-major): C = alpha * op(A) op(B) + beta * C with
// A [M,K] (or [K,M] transposed), B [K,N] (or [N,K] transposed), C [M,N]. Computed in fp32
// (CUBLAS_COMPUTE_32F: no TF32 shortcut), so fp32 parameters get fp32 products.

#include <capscope/cuda/blas.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gpt::detail {

template <class T> constexpr cudaDataType_t data_type = CUDA_R_32F;
template <> constexpr cudaDataType_t data_type<__nv_bfloat16> = CUDA_R_16BF;
template <> constexpr cudaDataType_t data_type<__half> = CUDA_R_16F;

struct gemm_shape {
    bool transpose_a = false, transpose_b = false;
    int m = 0, n = 0, k = 0;
};

//! C (of type `C_t`: the activation type, or float for weight gradients).
template <class T, class C_t>
void gemm(const capscope::cuda::blas_handle& blas, cudaStream_t s, gemm_shape g, const T* a, const T* b, C_t* c,
          float beta = 0.f, int batch = 1, long long stride_a = 0, long long stride_b = 0, long long stride_c = 0) {
    const float alpha = 1.f;
    const int lda = g.transpose_a ? g.m : g.k;
    const int ldb = g.transpose_b ? g.k : g.n;
    const cublasOperation_t op_a = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasHandle_t h = blas.on(s);
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    if (batch == 1) {
        CAPSCOPE_CHECK(cublasGemmEx(h, op_b, op_a, g.n, g.m, g.k, &alpha, b, data_type<T>, ldb, a, data_type<T>, lda, &beta, c,
                                    data_type<C_t>, g.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        CAPSCOPE_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, g.n, g.m, g.k, &alpha, b, data_type<T>, ldb, stride_b, a,
                                                  data_type<T>, lda, stride_a, &beta, c, data_type<C_t>, g.n, stride_c, batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

} // namespace gpt::detail
