#pragma once
//! @file
//! One checked-call facility for CUDA, cuBLAS and NCCL. A failed call throws `cuda::error`,
//! which carries the call as written, the library's error string, file:line and the capture
//! scope that was active (see `scope_label`), so a failure inside a graph capture says where.

#include <capscope/detail/scope_label.hpp>

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace capscope::cuda {

//! The library a failed call belongs to.
enum class library { cuda, cublas, nccl, mpi, cuda_driver };

constexpr std::string_view library_name(library l) {
    switch (l) {
    case library::cuda: return "CUDA";
    case library::cublas: return "cuBLAS";
    case library::nccl: return "NCCL";
    case library::mpi: return "MPI";
    case library::cuda_driver: return "CUDA driver";
    }
    return "?";
}

class error : public std::runtime_error {
public:
    error(library lib, int code, std::string description, std::string call, std::string file, int line,
          std::string scope)
        : std::runtime_error(format(lib, description, call, file, line, scope)),
          lib_(lib), code_(code), description_(std::move(description)), call_(std::move(call)),
          file_(std::move(file)), line_(line), scope_(std::move(scope)) {}

    library which() const noexcept { return lib_; }
    int code() const noexcept { return code_; }
    const std::string& description() const noexcept { return description_; }
    const std::string& call() const noexcept { return call_; }
    const std::string& file() const noexcept { return file_; }
    int line() const noexcept { return line_; }
    //! The capture scope active when the call failed; empty outside any scope.
    const std::string& scope() const noexcept { return scope_; }

private:
    static std::string format(library lib, const std::string& description, const std::string& call,
                              const std::string& file, int line, const std::string& scope) {
        std::string s(library_name(lib));
        s += " error: ";
        s += call;
        s += " failed: ";
        s += description;
        s += " at ";
        s += file;
        s += ':';
        s += std::to_string(line);
        s += scope.empty() ? std::string(" (outside any capture scope)") : " (in scope '" + scope + "')";
        return s;
    }

    library lib_;
    int code_;
    std::string description_, call_, file_;
    int line_;
    std::string scope_;
};

//! The scope label of capscope's stage layer, under its older name.
using capscope::scope_label;

namespace detail {

[[noreturn]] inline void raise(library lib, int code, const char* description, const char* call, const char* file,
                               int line) {
    throw error(lib, code, description ? description : "unknown error", call, file, line,
                std::string(capscope::detail::current_scope));
}

inline void check_status(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess) raise(library::cuda, static_cast<int>(status), cudaGetErrorString(status), call, file, line);
}

} // namespace detail
} // namespace capscope::cuda

//! Checks a CUDA runtime, cuBLAS (include capscope/cuda/blas.hpp) or NCCL (capscope/cuda/nccl.hpp) call.
#define CAPSCOPE_CHECK(...) ::capscope::cuda::detail::check_status((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

//! Checks the launch of the kernel just issued (configuration errors surface here, not at the
//! next synchronizing call).
#define CAPSCOPE_CHECK_LAUNCH(kernel_name) \
    ::capscope::cuda::detail::check_status(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)
