#pragma once
//! @file
//! Move-only owner of a CUDA stream.

#include <capscope/cuda/error.hpp>

#include <utility>

namespace capscope::cuda {

class stream {
public:
    //! Non-blocking by default: graph capture on the legacy default stream is not allowed, and a
    //! blocking stream would serialise against it.
    explicit stream(unsigned flags = cudaStreamNonBlocking) { CAPSCOPE_CHECK(cudaStreamCreateWithFlags(&handle_, flags)); }
    ~stream() {
        if (handle_) cudaStreamDestroy(handle_);
    }
    stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    stream& operator=(stream&& other) noexcept {
        if (this != &other) {
            if (handle_) cudaStreamDestroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    cudaStream_t get() const noexcept { return handle_; }
    operator cudaStream_t() const noexcept { return handle_; }
    void synchronize() const { CAPSCOPE_CHECK(cudaStreamSynchronize(handle_)); }

private:
    cudaStream_t handle_ = nullptr;
};

} // namespace capscope::cuda
