#pragma once
//! @file
//! Whether a usable GPU is present, without throwing: GPU tests and examples skip (exit 77)
//! on machines without one.

#include <cuda_runtime_api.h>

namespace capscope::cuda {

//! Number of CUDA devices the runtime can use; 0 when there is no driver or no device.
inline int usable_device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver" error for later callers
        return 0;
    }
    return n;
}

//! The exit code Meson (and Automake) read as "test skipped".
inline constexpr int skip_exit_code = 77;

} // namespace capscope::cuda
