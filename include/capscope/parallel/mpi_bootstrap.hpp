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

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <type_traits>
#include <utility>

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
//!
//! An error on one rank must not leave the others waiting: in a collective for a peer that will
//! never come, or in `MPI_Finalize`. So when an exception leaves the session's scope, its
//! destructor ends every rank with `MPI_Abort` instead of finalizing, after saying which rank
//! ended so. `abort_all` does the same with the error's text, and `run_ranks` calls it for any
//! exception of the trainer's function.
class mpi_session {
public:
    mpi_session() : exceptions_at_start_(std::uncaught_exceptions()) {
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
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && std::uncaught_exceptions() > exceptions_at_start_) {
            std::fprintf(stderr, "capscope: rank %d of %d is ending by an exception; MPI_Abort ends every rank (the others may be waiting for it)\n",
                         rank_, size_);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (owns_ && !finalized) MPI_Finalize();
    }
    //! Says on stderr that this rank failed and why, and ends every rank (`MPI_Abort`, exit code 1).
    [[noreturn]] void abort_all(std::string_view what) const noexcept {
        std::fprintf(stderr, "capscope: rank %d of %d failed: %.*s -- ending every rank (MPI_Abort)\n", rank_, size_, int(what.size()),
                     what.data());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::abort(); // MPI_Abort does not return; if it did, this rank still ends
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    //! The rank among the processes of this node: the GPU it takes.
    int local_rank() const noexcept { return local_rank_; }

private:
    int exceptions_at_start_;
    bool owns_ = false;
    int rank_ = 0, size_ = 1, local_rank_ = 0;
};

//! Runs `fn(session)` on this rank under a new MPI session and returns what it returns (0 when it
//! returns nothing). An exception from it ends every rank within MPI's abort (seconds), after this
//! rank has said what failed (a capscope error names the call, file, line and scope), instead of
//! leaving the others blocked in a collective. What `fn` made is destroyed first, as the exception
//! leaves it; a communicator destroyed so is aborted, not destroyed (nccl_communicator), so
//! nothing there waits for the other ranks.
template <class F>
int run_ranks(F&& fn) {
    mpi_session mpi;
    try {
        if constexpr (std::is_convertible_v<std::invoke_result_t<F&, mpi_session&>, int>) return std::forward<F>(fn)(mpi);
        else {
            std::forward<F>(fn)(mpi);
            return 0;
        }
    } catch (const std::exception& e) {
        mpi.abort_all(e.what());
    } catch (...) {
        mpi.abort_all("an exception that is not a std::exception");
    }
}

//! Takes GPU `local_rank` of this node and joins every rank of `mpi` in one NCCL communicator
//! (call it before making any stream or buffer: they belong to the device current then):
//! rank 0 makes the unique id, `MPI_Bcast` carries it.
inline nccl_communicator communicator_from_mpi(const mpi_session& mpi, nccl_options options = {}) {
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
    return nccl_communicator(mpi.size(), id, mpi.rank(), options);
}

} // namespace capscope::cuda
