#pragma once
//! @file
//! cuBLAS: checked calls, and a handle whose workspace is set once, at construction, so that no
//! cuBLAS call allocates inside a step or a graph capture (and results stay deterministic across
//! streams).

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <cublas_v2.h>

#include <cstddef>

namespace capscope::cuda::detail {
inline void check_status(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        raise(library::cublas, static_cast<int>(status), cublasGetStatusString(status), call, file, line);
}
} // namespace capscope::cuda::detail

namespace capscope::cuda {

class blas_handle {
public:
    //! 32 MiB: what cuBLAS documents as enough for Hopper.
    static constexpr std::size_t default_workspace_bytes = std::size_t{32} << 20;

    explicit blas_handle(std::size_t workspace_bytes = default_workspace_bytes) : workspace_(workspace_bytes) {
        CAPSCOPE_CHECK(cublasCreate(handle_.out()));
        CAPSCOPE_CHECK(cublasSetWorkspace(handle_.get(), workspace_.data(), workspace_.bytes()));
        // Pointer mode host: alpha and beta are host scalars, fixed at capture time.
        CAPSCOPE_CHECK(cublasSetPointerMode(handle_.get(), CUBLAS_POINTER_MODE_HOST));
    }

    //! The handle bound to `s`: every call goes through here, so no call runs on a stale stream.
    cublasHandle_t on(cudaStream_t s) const {
        CAPSCOPE_CHECK(cublasSetStream(handle_.get(), s));
        // cublasSetStream resets the workspace to the default pool; set ours again (no allocation).
        CAPSCOPE_CHECK(cublasSetWorkspace(handle_.get(), workspace_.data(), workspace_.bytes()));
        return handle_.get();
    }
    std::size_t workspace_bytes() const noexcept { return workspace_.bytes(); }

private:
    // Declared first, destroyed last: the handle goes before the workspace it points into.
    device_buffer<std::byte> workspace_;
    capscope::detail::unique_handle<cublasHandle_t, &cublasDestroy> handle_;
};

} // namespace capscope::cuda
