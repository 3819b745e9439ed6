#pragma once
//! @file
//! The CUDA driver's calls, found through the runtime so that nothing links libcuda directly,
//! and their `CUresult` checked by `CAPSCOPE_CHECK` like any other call.

#include <capscope/cuda/error.hpp>

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace capscope::cuda::detail {

inline void check_status(CUresult status, const char* call, const char* file, int line) {
    if (status != CUDA_SUCCESS) raise(library::cuda_driver, static_cast<int>(status), "a CUDA driver error (CUresult)", call, file, line);
}

//! The driver's function `name` at ABI `version`, the number in its `PFN_<name>_v<version>`
//! type (`Fn`), or null where the driver has none (an older driver).
template <class Fn>
Fn driver_entry_if_any(const char* name, unsigned version) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CAPSCOPE_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found));
    return found == cudaDriverEntryPointSuccess && fn ? reinterpret_cast<Fn>(fn) : nullptr;
}

//! The same, refused by name where the driver has none.
template <class Fn>
Fn driver_entry(const char* name, unsigned version) {
    if (const Fn fn = driver_entry_if_any<Fn>(name, version)) return fn;
    throw std::runtime_error(std::string("capscope: the CUDA driver has no ") + name + " -- fix: a driver of CUDA 12 or later");
}

} // namespace capscope::cuda::detail
