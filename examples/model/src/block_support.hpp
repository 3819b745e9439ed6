#pragma once
// What the blocks' source files share: element counts and the residual copy.

#include <capscope/cuda/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gpt::detail {

inline std::size_t n_elems(long a, long b = 1, long c = 1) { return std::size_t(a) * std::size_t(b) * std::size_t(c); }

template <class T> void copy_rows(T* dst, const T* src, std::size_t count, cudaStream_t s) {
    CAPSCOPE_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, s));
}

} // namespace gpt::detail
