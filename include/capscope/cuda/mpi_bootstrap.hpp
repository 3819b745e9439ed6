#pragma once
//! @file
//! Several GPUs, one process each, started by `mpirun -np N`: MPI gives each process its rank and
//! its GPU on the node, and carries NCCL's unique id from rank 0 to the others (`MPI_Bcast`); NCCL
//! does every collective after that. docs/multi_gpu.md says why this bootstrap and not a launcher
//! that forks one child per GPU.

#include <capscope/cuda/nccl.hpp>

// The C interface only: OpenMPI's and MPICH's deprecated C++ bindings do not build warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

namespace capscope::cuda::detail {
inline void check_mpi(int status, const char* call, const char* file, int line) {
    if (status != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) length = 0;
        text[length] = '\0';
        raise(library::mpi, status, text, call, file, line);
    }
}
} // namespace capscope::cuda::detail

//! Checks an MPI call (MPI's own error string, the call, file and line, and the scope).
#define CAPSCOPE_MPI_CHECK(...) ::capscope::cuda::detail::check_mpi((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

namespace capscope::cuda {

//! MPI for the life of the object (initialized unless someone else did; finalized if it initialized),
//! with MPI's errors returned as codes so that they are checked, not fatal.
class mpi_session {
public:
    mpi_session() {
        int initialized = 0;
        CAPSCOPE_MPI_CHECK(MPI_Initialized(&initialized));
        if (!initialized) {
            CAPSCOPE_MPI_CHECK(MPI_Init(nullptr, nullptr));
            owns_ = true;
        }
        CAPSCOPE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        CAPSCOPE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
        CAPSCOPE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
        MPI_Comm node = MPI_COMM_NULL;
        CAPSCOPE_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
        CAPSCOPE_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
        CAPSCOPE_MPI_CHECK(MPI_Comm_free(&node));
    }
    ~mpi_session() {
        if (owns_) MPI_Finalize();
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    //! The rank among the processes of this node: the GPU it takes.
    int local_rank() const noexcept { return local_rank_; }

private:
    bool owns_ = false;
    int rank_ = 0, size_ = 1, local_rank_ = 0;
};

//! Takes GPU `local_rank` of this node and joins every rank of `mpi` in one NCCL communicator
//! (call it before making any stream or buffer: they belong to the device current then):
//! rank 0 makes the unique id, `MPI_Bcast` carries it.
inline nccl_communicator communicator_from_mpi(const mpi_session& mpi) {
    int devices = 0;
    CAPSCOPE_CHECK(cudaGetDeviceCount(&devices));
    if (mpi.local_rank() >= devices)
        throw std::runtime_error("rank " + std::to_string(mpi.rank()) + " is process " + std::to_string(mpi.local_rank()) +
                                 " on its node, which has " + std::to_string(devices) +
                                 " GPU(s) -- fix: start at most one process per GPU (mpirun -np <GPUs>)");
    CAPSCOPE_CHECK(cudaSetDevice(mpi.local_rank()));
    ncclUniqueId id{};
    if (mpi.rank() == 0) CAPSCOPE_CHECK(ncclGetUniqueId(&id));
    CAPSCOPE_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    return nccl_communicator(mpi.size(), id, mpi.rank());
}

} // namespace capscope::cuda
