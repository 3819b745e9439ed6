#pragma once
//! @file
//! Move-only owners of a captured CUDA graph and of its executable instance, and `capture()`,
//! which records the work a callable issues on a stream into a graph. Every `cudaGraph_t` and
//! `cudaGraphExec_t` capscope creates is owned here, and `live_graphs()` counts the ones alive
//! (set-up and clean-up only: nothing on the launch path).

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>

namespace capscope::cuda {

//! CUDA's reason for refusing an update, in words.
constexpr const char* update_refusal_name(cudaGraphExecUpdateResult r) {
    switch (r) {
    case cudaGraphExecUpdateSuccess: return "none";
    case cudaGraphExecUpdateErrorTopologyChanged: return "topology changed";
    case cudaGraphExecUpdateErrorNodeTypeChanged: return "node type changed";
    case cudaGraphExecUpdateErrorFunctionChanged: return "kernel function changed";
    case cudaGraphExecUpdateErrorParametersChanged: return "parameters changed in an unsupported way";
    case cudaGraphExecUpdateErrorNotSupported: return "not supported";
    case cudaGraphExecUpdateErrorUnsupportedFunctionChange: return "unsupported kernel function change";
    case cudaGraphExecUpdateErrorAttributesChanged: return "node attributes changed";
    default: return "other";
    }
}

//! CUDA graphs and executable graphs alive in this process, created through capscope.
struct graph_census {
    long graphs = 0;
    long execs = 0;
    friend constexpr bool operator==(const graph_census&, const graph_census&) = default;
};

namespace detail {
inline std::atomic<long> live_graph_count{0};
inline std::atomic<long> live_exec_count{0};
inline cudaError_t destroy_graph(cudaGraph_t g) {
    --live_graph_count;
    return cudaGraphDestroy(g);
}
inline cudaError_t destroy_exec(cudaGraphExec_t e) {
    --live_exec_count;
    return cudaGraphExecDestroy(e);
}
} // namespace detail

inline graph_census live_graphs() noexcept { return {detail::live_graph_count.load(), detail::live_exec_count.load()}; }

//! Whether `cudaGraphExecUpdate` applied a graph to an executable graph, or why it could not.
enum class update_result {
    updated, //!< applied in place
    refused, //!< not the same topology (nodes, edges, node types, kernel changes CUDA cannot apply)
};

class graph {
public:
    graph() = default;
    explicit graph(cudaGraph_t adopted) noexcept : handle_(adopted) {
        if (adopted) ++detail::live_graph_count;
    }

    cudaGraph_t get() const noexcept { return handle_.get(); }
    explicit operator bool() const noexcept { return bool(handle_); }
    std::size_t node_count() const {
        std::size_t n = 0;
        CAPSCOPE_CHECK(cudaGraphGetNodes(get(), nullptr, &n));
        return n;
    }

    //! What this graph's nodes refer to without owning it: for a copy made by
    //! `without_user_objects` (graph_copy.hpp), the graph it was copied from, whose user objects
    //! keep NCCL's plans alive. An executable graph instantiated from this one holds it too.
    const std::shared_ptr<const void>& keeps_alive() const noexcept { return keep_; }
    //! `finished`, when given: an event the graph records once all its other work has finished, at
    //! every launch, and that `what` keeps alive (a copy's, graph_copy.hpp).
    void keep_alive(std::shared_ptr<const void> what, cudaEvent_t finished = nullptr) noexcept {
        keep_ = std::move(what);
        finished_ = finished;
    }
    //! The event each launch records once all its work has finished, alive while `keeps_alive()`
    //! is; null for a graph that records none (not a copy).
    cudaEvent_t finished_event() const noexcept { return finished_; }

private:
    std::shared_ptr<const void> keep_; // declared first, released last
    cudaEvent_t finished_ = nullptr;   // owned by what keep_ holds
    capscope::detail::unique_handle<cudaGraph_t, &detail::destroy_graph> handle_;
};

class graph_exec {
public:
    graph_exec() = default;
    explicit graph_exec(const graph& g) {
        CAPSCOPE_CHECK(cudaGraphInstantiate(handle_.out(), g.get(), 0));
        ++detail::live_exec_count;
        keep_ = g.keeps_alive();
        finished_ = g.finished_event();
    }

    cudaGraphExec_t get() const noexcept { return handle_.get(); }
    explicit operator bool() const noexcept { return bool(handle_); }
    void launch(cudaStream_t s) const { CAPSCOPE_CHECK(cudaGraphLaunch(get(), s)); }
    //! What keeps this graph's nodes valid, and the event each launch records once all its work
    //! has finished (null when the graph records none): graph::keeps_alive, graph::finished_event.
    const std::shared_ptr<const void>& keeps_alive() const noexcept { return keep_; }
    cudaEvent_t finished_event() const noexcept { return finished_; }

    //! Applies `g`'s node parameters (kernel arguments, launch sizes, memcpy addresses) to this
    //! executable graph in place, when `g` has its topology (`cudaGraphExecUpdate`). Returns
    //! `refused` when CUDA cannot apply it (then instantiate `g` anew; this graph is unchanged
    //! and still usable); any other failure throws.
    //! `why`, when given, receives CUDA's reason for a refusal.
    update_result update(const graph& g, cudaGraphExecUpdateResult* why = nullptr) {
        cudaGraphExecUpdateResultInfo info{};
        const cudaError_t e = cudaGraphExecUpdate(get(), g.get(), &info);
        if (why) *why = info.result;
        if (e == cudaSuccess) {
            keep_ = g.keeps_alive(); // the nodes now refer to what `g`'s refer to
            finished_ = g.finished_event(); // (an update keeps the topology, so a copy's record node too, with its event)
            return update_result::updated;
        }
        if (e == cudaErrorGraphExecUpdateFailure) {
            cudaGetLastError(); // reported by the result, not by the next call
            return update_result::refused;
        }
        CAPSCOPE_CHECK(e);
        return update_result::refused;
    }

private:
    std::shared_ptr<const void> keep_; // declared first, released last: see graph::keeps_alive
    cudaEvent_t finished_ = nullptr;   // owned by what keep_ holds
    capscope::detail::unique_handle<cudaGraphExec_t, &detail::destroy_exec> handle_;
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
