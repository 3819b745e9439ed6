#pragma once
// The multi-GPU tests' one MPI session and one NCCL communicator, shared by their files: made on
// first use (the communicator takes this rank's GPU, so make it before any stream or buffer).

#include <capscope/parallel/mpi_bootstrap.hpp>
#include <capscope/cuda/nccl.hpp>

namespace support {

inline capscope::cuda::mpi_session& mpi() {
    static capscope::cuda::mpi_session session;
    return session;
}
inline capscope::cuda::nccl_communicator& comm() {
    static capscope::cuda::nccl_communicator c = capscope::cuda::communicator_from_mpi(mpi());
    return c;
}

} // namespace support
