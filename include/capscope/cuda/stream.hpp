#pragma once
//! @file
//! Move-only owner of a CUDA stream.

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

namespace capscope::cuda {

class stream {
public:
    //! Non-blocking by default: graph capture on the legacy default stream is not allowed, and a
    //! blocking stream would serialise against it.
    explicit stream(unsigned flags = cudaStreamNonBlocking) { CAPSCOPE_CHECK(cudaStreamCreateWithFlags(handle_.out(), flags)); }

    cudaStream_t get() const noexcept { return handle_.get(); }
    operator cudaStream_t() const noexcept { return handle_.get(); }
    void synchronize() const { CAPSCOPE_CHECK(cudaStreamSynchronize(get())); }

private:
    capscope::detail::unique_handle<cudaStream_t, &cudaStreamDestroy> handle_;
};

} // namespace capscope::cuda
