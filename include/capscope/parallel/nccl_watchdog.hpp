#pragma once
//! @file
//! The step watchdog (parallel/step_watchdog.hpp) over one NCCL communicator: it polls
//! `ncclCommGetAsyncError` and, once a step is enqueued, an event recorded after it. On a fault it
//! says which rank failed and what it was doing and ends the process (std::abort), so that
//! `mpirun` ends the job. It does not abort the communicator first: the process ends anyway, and
//! `ncclCommAbort` waits for the kernels running on the device, so a rank stuck in a kernel of its
//! own would never get past it. With a handler of the trainer's, which keeps the process, it
//! aborts the communicator (NCCL's kernels waiting for a peer give up) and then calls it; the
//! communicator is dead after that (`aborted()`), and the watched communicator must not move.
//! A trainer runs each step through `step(runner, stream)` (gpt::data_parallel_trainer does), or
//! calls `begin_step` before a step's enqueue and `end_step` after it.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/parallel/step_watchdog.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

namespace capscope::cuda {

class nccl_watchdog {
public:
    //! Watches `comm` (which outlives the watchdog and does not move). Without `on_fault`, a
    //! fault ends the process (std::abort), and under mpirun every rank; with it, the
    //! communicator is aborted, with those split from it (a pipeline's edges), and `on_fault`
    //! runs, on the watchdog's thread, once the aborts have returned or after
    //! `settings.abort_timeout`.
    explicit nccl_watchdog(const nccl_communicator& comm, watchdog_settings settings = {}, step_watchdog::fault_handler on_fault = {})
        : comm_(&comm), rank_(comm.rank()), size_(comm.size()), device_(device_of(comm)), abort_timeout_(settings.abort_timeout), on_fault_(std::move(on_fault)),
          dog_(probes(), [this](const watchdog_fault& f) { fault(f); }, settings) {}

    //! Before a step's enqueue. `steady`: the graphs replay (the step timeout applies; the warmup
    //! timeout otherwise).
    void begin_step(bool steady) { dog_.begin_step(steady); }
    //! Nothing to watch until the next begin_step (a step that threw).
    void disarm() { dog_.disarm(); }
    //! After a step's enqueue on `s`: an event marks when the device is done with it.
    void end_step(cudaStream_t s) {
        done_.record(s);
        dog_.end_enqueue();
    }
    //! One step of a capscope runner, watched: the step timeout applies once the graphs replay
    //! (the step before replayed and captured nothing, or the plan has no graphs), the warmup
    //! timeout until then (the eager warmup steps, and the step that captures). A step that
    //! throws disarms the watchdog as the exception leaves.
    template <class Runner> void step(Runner& runner, cudaStream_t s) {
        const long captures = runner.counters().captures, replays = runner.counters().replays;
        begin_step(steady_);
        struct disarm_on_throw {
            step_watchdog& dog;
            int exceptions = std::uncaught_exceptions();
            ~disarm_on_throw() {
                if (std::uncaught_exceptions() > exceptions) dog.disarm();
            }
        } guard{dog_};
        runner.step(s);
        end_step(s);
        const bool replayed = runner.plan().graph_count == 0 || runner.counters().replays > replays;
        steady_ = replayed && runner.counters().captures == captures;
    }
    bool fired() const { return dog_.fired(); }
    int rank() const noexcept { return rank_; }

private:
    step_watchdog::probes probes() {
        return {[this] { return async_error(); }, [this] { return step_finished(); }};
    }
    static int device_of(const nccl_communicator& comm) {
        int d = 0;
        CAPSCOPE_CHECK(ncclCommCuDevice(comm.get(), &d));
        return d;
    }
    //! Once, on the watchdog's thread: the rank's device, and no capture checks of its queries,
    //! which touch no captured stream (cudaStreamCaptureModeRelaxed), so that a trainer capturing
    //! in the global mode is not failed by them.
    void set_up_thread() {
        thread_local bool done = false;
        if (done) return;
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        if (cudaSetDevice(device_) != cudaSuccess || cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
            device_error_ = "the watchdog's thread could not take device " + std::to_string(device_);
        done = true;
    }
    std::string async_error() {
        set_up_thread();
        if (!device_error_.empty()) return device_error_;
        ncclResult_t state = ncclSuccess;
        const ncclResult_t polled = ncclCommGetAsyncError(comm_->get(), &state);
        if (polled != ncclSuccess) return std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(polled);
        if (state == ncclSuccess || state == ncclInProgress) return {};
        return std::string("NCCL reports an asynchronous error: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_->get()) + ")";
    }
    bool step_finished() {
        const cudaError_t e = cudaEventQuery(done_.get());
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) device_error_ = std::string("the step's work failed on the device: ") + cudaGetErrorString(e);
        return false;
    }
    void fault(const watchdog_fault& f) {
        std::fprintf(stderr, "capscope watchdog: rank %d of %d: %s -- %s\n", rank_, size_, f.what.c_str(),
                     on_fault_ ? "aborting its NCCL communicator, then the trainer's fault handler" : "ending the process");
        std::fflush(stderr);
        if (!on_fault_) std::abort(); // a hung step cannot be unwound; mpirun ends the other ranks
        // Those split from it too (a pipeline's edges), at once; the handler runs even if NCCL's
        // teardown waits.
        if (!comm_->abort(abort_timeout_)) {
            std::fprintf(stderr, "capscope watchdog: rank %d of %d: its NCCL communicators' aborts have not returned within %lld ms "
                                 "(watchdog_settings::abort_timeout; the step's kernels have been told to end) -- the fault handler "
                                 "runs now; end the process after it\n",
                         rank_, size_, static_cast<long long>(abort_timeout_.count()));
            std::fflush(stderr);
        }
        on_fault_(f);
    }

    const nccl_communicator* comm_;
    int rank_, size_, device_;
    std::chrono::milliseconds abort_timeout_;
    step_watchdog::fault_handler on_fault_;
    bool steady_ = false;      // step(): the last step replayed and captured nothing
    std::string device_error_; // from step_finished, reported by the next async_error (both on the watchdog's thread)
    event done_;
    step_watchdog dog_; // last: its thread may call the members above from its first tick
};

} // namespace capscope::cuda
