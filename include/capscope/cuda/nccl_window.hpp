#pragma once
//! @file
//! Device memory that NCCL allocates (`ncclMemAlloc`) and registers on a communicator as a
//! symmetric window (`ncclCommWindowRegister`, `NCCL_WIN_COLL_SYMMETRIC`). A collective whose
//! buffers lie in such windows, at the same offset on every rank, may use NCCL's symmetric
//! kernels; on a communicator with `nccl_cta_policy::zero` (nccl.hpp, NCCL 2.28+) an all-gather
//! within one node becomes copy-engine copies, which take no SM from the compute beside it.
//!
//! Registration is collective: every rank of the communicator makes the same buffers, of the same
//! sizes, in the same order (a rank that does not waits for the others). The NCCL communicator
//! must outlive them; the object holding it may move. Where NCCL gives no window (no symmetric
//! memory on this machine), the constructor throws rather than let the collectives fall back to
//! kernels unseen. NCCL_CTA_POLICY in the environment overrides a communicator's CTA policy.

#include <capscope/cuda/nccl.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
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
    nccl_symmetric_buffer(const nccl_communicator& comm, std::size_t count)
        : comm_(comm.get()), aborted_(comm.aborted_flag()), size_(count) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
        if (count == 0) return;
        // On the communicator's GPU, whichever is current (several GPUs in one process).
        int device = 0, current = 0;
        CAPSCOPE_CHECK(ncclCommCuDevice(comm_, &device));
        CAPSCOPE_CHECK(cudaGetDevice(&current));
        if (device != current) CAPSCOPE_CHECK(cudaSetDevice(device));
        struct restore {
            int device, current;
            ~restore() {
                if (device != current) (void)cudaSetDevice(current);
            }
        } back{device, current};
        CAPSCOPE_CHECK(ncclMemAlloc(&memory_, count * sizeof(T)));
        const ncclResult_t r = ncclCommWindowRegister(comm_, memory_, count * sizeof(T), &window_, NCCL_WIN_COLL_SYMMETRIC);
        if (r != ncclSuccess || window_ == nullptr) {
            (void)ncclMemFree(memory_);
            memory_ = nullptr;
            size_ = 0;
            CAPSCOPE_CHECK(r);
            // NCCL registers no window where it has no symmetric memory, and says nothing: the
            // collectives would silently run NCCL's kernels instead.
            throw std::runtime_error("nccl_symmetric_buffer: NCCL registered no symmetric window (it needs every GPU of the communicator "
                                     "on one node and peer to peer, NCCL_WIN_ENABLE=1 and NCCL_CUMEM_ENABLE=1) -- fix: "
                                     "cuda::device_buffer (gpt::collective_buffers::device), or a setting that allows windows");
        }
#else
        throw std::invalid_argument("nccl_symmetric_buffer: symmetric windows need NCCL 2.27 or later (this is " + std::to_string(NCCL_MAJOR) +
                                    "." + std::to_string(NCCL_MINOR) + ") -- fix: cuda::device_buffer, or a newer NCCL");
#endif
    }
    nccl_symmetric_buffer(nccl_symmetric_buffer&& o) noexcept
        : comm_(std::exchange(o.comm_, nullptr)), aborted_(std::move(o.aborted_)), memory_(std::exchange(o.memory_, nullptr)),
          size_(std::exchange(o.size_, 0)), window_(std::exchange(o.window_, nullptr)) {}
    nccl_symmetric_buffer& operator=(nccl_symmetric_buffer&& o) noexcept {
        if (this != &o) {
            release();
            comm_ = std::exchange(o.comm_, nullptr);
            aborted_ = std::move(o.aborted_);
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
        if (window_ && !(aborted_ && aborted_->load())) (void)ncclCommWindowDeregister(comm_, window_);
        (void)ncclMemFree(memory_);
        memory_ = nullptr;
        window_ = nullptr;
#endif
    }

    ncclComm_t comm_ = nullptr; //!< not the communicator object, which may move
    std::shared_ptr<const std::atomic<bool>> aborted_;
    void* memory_ = nullptr;
    std::size_t size_ = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    ncclWindow_t window_ = nullptr;
#else
    void* window_ = nullptr;
#endif
};

} // namespace capscope::cuda
