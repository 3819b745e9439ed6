#pragma once
//! @file
//! Device memory that NCCL allocates (`ncclMemAlloc`) and registers on a communicator as a
//! symmetric window (`ncclCommWindowRegister`, `NCCL_WIN_COLL_SYMMETRIC`). A collective whose
//! buffers lie in such windows, at the same offset on every rank, may use NCCL's symmetric
//! kernels; on a communicator with `nccl_cta_policy::zero` (nccl.hpp, NCCL 2.28+) an all-gather
//! within one node becomes copy-engine copies, which take no SM from the compute beside it.
//!
//! Registration is collective: every rank of the communicator makes the same buffers, of the same
//! sizes, in the same order, and so does their destruction. The communicator must outlive them.

#include <capscope/cuda/nccl.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace capscope::cuda {

template <class T>
class nccl_symmetric_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "CUDA buffers hold trivially copyable elements");

public:
    nccl_symmetric_buffer() = default;
    //! `count` elements on this rank, registered on `comm` (every rank calls it with the same count).
    nccl_symmetric_buffer(const nccl_communicator& comm, std::size_t count) : comm_(&comm), size_(count) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
        if (count == 0) return;
        CAPSCOPE_CHECK(ncclMemAlloc(&memory_, count * sizeof(T)));
        if (const ncclResult_t r = ncclCommWindowRegister(comm.get(), memory_, count * sizeof(T), &window_, NCCL_WIN_COLL_SYMMETRIC);
            r != ncclSuccess) {
            (void)ncclMemFree(memory_);
            CAPSCOPE_CHECK(r);
        }
#else
        throw std::invalid_argument("nccl_symmetric_buffer: symmetric windows need NCCL 2.27 or later (this is " + std::to_string(NCCL_MAJOR) +
                                    "." + std::to_string(NCCL_MINOR) + ") -- fix: cuda::device_buffer, or a newer NCCL");
#endif
    }
    nccl_symmetric_buffer(nccl_symmetric_buffer&& o) noexcept
        : comm_(std::exchange(o.comm_, nullptr)), memory_(std::exchange(o.memory_, nullptr)), size_(std::exchange(o.size_, 0)),
          window_(std::exchange(o.window_, nullptr)) {}
    nccl_symmetric_buffer& operator=(nccl_symmetric_buffer&& o) noexcept {
        if (this != &o) {
            release();
            comm_ = std::exchange(o.comm_, nullptr);
            memory_ = std::exchange(o.memory_, nullptr);
            size_ = std::exchange(o.size_, 0);
            window_ = std::exchange(o.window_, nullptr);
        }
        return *this;
    }
    ~nccl_symmetric_buffer() { release(); }

    T* data() const noexcept { return static_cast<T*>(memory_); }
    std::size_t size() const noexcept { return size_; }
    std::size_t bytes() const noexcept { return size_ * sizeof(T); }
    bool empty() const noexcept { return size_ == 0; }

private:
    void release() noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
        if (!memory_) return;
        // An aborted communicator takes no more calls; the memory is freed either way.
        if (window_ && !comm_->aborted()) (void)ncclCommWindowDeregister(comm_->get(), window_);
        (void)ncclMemFree(memory_);
        memory_ = nullptr;
        window_ = nullptr;
#endif
    }

    const nccl_communicator* comm_ = nullptr;
    void* memory_ = nullptr;
    std::size_t size_ = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    ncclWindow_t window_ = nullptr;
#else
    void* window_ = nullptr;
#endif
};

} // namespace capscope::cuda
