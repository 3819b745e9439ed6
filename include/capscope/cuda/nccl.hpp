#pragma once
//! @file
//! NCCL: checked calls (the same `CAPSCOPE_CHECK` as CUDA and cuBLAS) and a move-only communicator.

#include <capscope/cuda/error.hpp>

#include <nccl.h>

#include <utility>

namespace capscope::cuda::detail {
inline void check_status(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess) raise(library::nccl, static_cast<int>(status), ncclGetErrorString(status), call, file, line);
}
} // namespace capscope::cuda::detail

namespace capscope::cuda {

class nccl_communicator {
public:
    nccl_communicator(int ranks, const ncclUniqueId& id, int rank) { CAPSCOPE_CHECK(ncclCommInitRank(&comm_, ranks, id, rank)); }
    ~nccl_communicator() {
        if (comm_) ncclCommDestroy(comm_);
    }
    nccl_communicator(nccl_communicator&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
    nccl_communicator& operator=(nccl_communicator&& o) noexcept {
        if (this != &o) {
            if (comm_) ncclCommDestroy(comm_);
            comm_ = std::exchange(o.comm_, nullptr);
        }
        return *this;
    }
    nccl_communicator(const nccl_communicator&) = delete;
    nccl_communicator& operator=(const nccl_communicator&) = delete;

    ncclComm_t get() const noexcept { return comm_; }

private:
    ncclComm_t comm_ = nullptr;
};

} // namespace capscope::cuda
