#pragma once
//! @file
//! NCCL: checked calls (the same `CAPSCOPE_CHECK` as CUDA and cuBLAS) and a move-only communicator.

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <nccl.h>

namespace capscope::cuda::detail {
inline void check_status(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess) raise(library::nccl, static_cast<int>(status), ncclGetErrorString(status), call, file, line);
}
} // namespace capscope::cuda::detail

namespace capscope::cuda {

class nccl_communicator {
public:
    nccl_communicator(int ranks, const ncclUniqueId& id, int rank) { CAPSCOPE_CHECK(ncclCommInitRank(comm_.out(), ranks, id, rank)); }

    ncclComm_t get() const noexcept { return comm_.get(); }

private:
    capscope::detail::unique_handle<ncclComm_t, &ncclCommDestroy> comm_;
};

} // namespace capscope::cuda
