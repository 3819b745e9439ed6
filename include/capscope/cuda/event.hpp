#pragma once
//! @file
//! Move-only owner of a CUDA event: orders work across streams, and times device work.

#include <capscope/cuda/error.hpp>

#include <utility>

namespace capscope::cuda {

class event {
public:
    //! Timing is off by default: such events are cheaper to record and wait on.
    explicit event(unsigned flags = cudaEventDisableTiming) { CAPSCOPE_CHECK(cudaEventCreateWithFlags(&handle_, flags)); }
    static event timing() { return event(cudaEventDefault); }
    ~event() {
        if (handle_) cudaEventDestroy(handle_);
    }
    event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    event& operator=(event&& other) noexcept {
        if (this != &other) {
            if (handle_) cudaEventDestroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;

    cudaEvent_t get() const noexcept { return handle_; }
    void record(cudaStream_t s) const { CAPSCOPE_CHECK(cudaEventRecord(handle_, s)); }
    //! Makes `s` wait for the work recorded before this event.
    void wait_on(cudaStream_t s) const { CAPSCOPE_CHECK(cudaStreamWaitEvent(s, handle_, 0)); }
    void synchronize() const { CAPSCOPE_CHECK(cudaEventSynchronize(handle_)); }

    //! Milliseconds between two recorded timing events.
    static float elapsed_ms(const event& start, const event& stop) {
        float ms = 0;
        CAPSCOPE_CHECK(cudaEventElapsedTime(&ms, start.handle_, stop.handle_));
        return ms;
    }

private:
    cudaEvent_t handle_ = nullptr;
};

} // namespace capscope::cuda
