#pragma once
//! @file
//! Move-only owner of a CUDA event: orders work across streams, and times device work.

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

namespace capscope::cuda {

class event {
public:
    //! Timing is off by default: such events are cheaper to record and wait on.
    explicit event(unsigned flags = cudaEventDisableTiming) { CAPSCOPE_CHECK(cudaEventCreateWithFlags(handle_.out(), flags)); }
    static event timing() { return event(cudaEventDefault); }

    cudaEvent_t get() const noexcept { return handle_.get(); }
    void record(cudaStream_t s) const { CAPSCOPE_CHECK(cudaEventRecord(get(), s)); }
    //! Makes `s` wait for the work recorded before this event.
    void wait_on(cudaStream_t s) const { CAPSCOPE_CHECK(cudaStreamWaitEvent(s, get(), 0)); }
    void synchronize() const { CAPSCOPE_CHECK(cudaEventSynchronize(get())); }

    //! Milliseconds between two recorded timing events.
    static float elapsed_ms(const event& start, const event& stop) {
        float ms = 0;
        CAPSCOPE_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
        return ms;
    }

private:
    capscope::detail::unique_handle<cudaEvent_t, &cudaEventDestroy> handle_;
};

} // namespace capscope::cuda
