#pragma once
//! @file
//! Move-only owners of a captured CUDA graph and of its executable instance, and `capture()`,
//! which records the work a callable issues on a stream into a graph.

#include <capscope/cuda/error.hpp>

#include <exception>
#include <utility>

namespace capscope::cuda {

class graph {
public:
    graph() = default;
    explicit graph(cudaGraph_t adopted) noexcept : handle_(adopted) {}
    ~graph() {
        if (handle_) cudaGraphDestroy(handle_);
    }
    graph(graph&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    graph& operator=(graph&& other) noexcept {
        if (this != &other) {
            if (handle_) cudaGraphDestroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    graph(const graph&) = delete;
    graph& operator=(const graph&) = delete;

    cudaGraph_t get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    std::size_t node_count() const {
        std::size_t n = 0;
        CAPSCOPE_CHECK(cudaGraphGetNodes(handle_, nullptr, &n));
        return n;
    }

private:
    cudaGraph_t handle_ = nullptr;
};

class graph_exec {
public:
    graph_exec() = default;
    explicit graph_exec(const graph& g) { CAPSCOPE_CHECK(cudaGraphInstantiate(&handle_, g.get(), 0)); }
    ~graph_exec() {
        if (handle_) cudaGraphExecDestroy(handle_);
    }
    graph_exec(graph_exec&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    graph_exec& operator=(graph_exec&& other) noexcept {
        if (this != &other) {
            if (handle_) cudaGraphExecDestroy(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    graph_exec(const graph_exec&) = delete;
    graph_exec& operator=(const graph_exec&) = delete;

    cudaGraphExec_t get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    void launch(cudaStream_t s) const { CAPSCOPE_CHECK(cudaGraphLaunch(handle_, s)); }

private:
    cudaGraphExec_t handle_ = nullptr;
};

//! Captures what `work(stream)` issues on `s` into a graph. If `work` throws, or the capture is
//! invalidated, the capture is ended and the partial graph destroyed before the error propagates,
//! so the stream is usable again.
template <class Work>
graph capture(cudaStream_t s, Work&& work, cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    CAPSCOPE_CHECK(cudaStreamBeginCapture(s, mode));
    try {
        std::forward<Work>(work)(s);
    } catch (...) {
        cudaGraph_t partial = nullptr;
        cudaStreamEndCapture(s, &partial);
        if (partial) cudaGraphDestroy(partial);
        cudaGetLastError(); // the capture error is reported by the exception in flight
        throw;
    }
    cudaGraph_t captured = nullptr;
    CAPSCOPE_CHECK(cudaStreamEndCapture(s, &captured));
    return graph(captured);
}

} // namespace capscope::cuda
