#pragma once
//! @file
//! Move-only owners of a captured CUDA graph and of its executable instance, and `capture()`,
//! which records the work a callable issues on a stream into a graph.

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <cstddef>
#include <utility>

namespace capscope::cuda {

class graph {
public:
    graph() = default;
    explicit graph(cudaGraph_t adopted) noexcept : handle_(adopted) {}

    cudaGraph_t get() const noexcept { return handle_.get(); }
    explicit operator bool() const noexcept { return bool(handle_); }
    std::size_t node_count() const {
        std::size_t n = 0;
        CAPSCOPE_CHECK(cudaGraphGetNodes(get(), nullptr, &n));
        return n;
    }

private:
    capscope::detail::unique_handle<cudaGraph_t, &cudaGraphDestroy> handle_;
};

class graph_exec {
public:
    graph_exec() = default;
    explicit graph_exec(const graph& g) { CAPSCOPE_CHECK(cudaGraphInstantiate(handle_.out(), g.get(), 0)); }

    cudaGraphExec_t get() const noexcept { return handle_.get(); }
    explicit operator bool() const noexcept { return bool(handle_); }
    void launch(cudaStream_t s) const { CAPSCOPE_CHECK(cudaGraphLaunch(get(), s)); }

private:
    capscope::detail::unique_handle<cudaGraphExec_t, &cudaGraphExecDestroy> handle_;
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
