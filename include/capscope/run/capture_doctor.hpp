#pragma once
//! @file
//! The capture doctor: during the last eager warmup step, every CUDA call a stage makes is
//! watched (CUPTI's callback API, loaded at run time: no link dependency) and held against what a
//! graph can take, for the stages whose segments will be captured. Before the first capture, the
//! runner refuses what it found (plan rule P20), naming the stage, the call, the stream and the
//! fix, or, under `capture_failure::run_eagerly`, leaves those graphs eager. Eagerly each of these
//! calls works, and captured each fails or, worse, is lost:
//! - a launch or copy on the legacy default stream (it invalidates the capture);
//! - work enqueued on a stream the stage was not given and did not fork from it (it runs once,
//!   while capturing, and is missing from every replay);
//! - a synchronous copy or memset, a stream, event or device synchronization, an allocation
//!   (outside `capture_mode::relaxed`);
//! - an event or stream query;
//! - work forked onto another stream and not joined back before the stage returns.
//! Because the doctor speaks before any capture, a trainer whose own error check calls `exit()`
//! on a failed capture never gets there. Nothing is watched after that step (the executor's
//! eager call path tests one pointer); the engine option `capture_doctor_off` turns it off.

#include <capscope/cuda/error.hpp>
#include <capscope/run/cupti_loader.hpp>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h> // with the calls' parameter structs (generated_cuda_*_meta.h)

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace capscope {

//! One call a graph could not hold, in a stage that will be captured.
struct doctor_finding {
    std::string stage;   //!< the stage that made it
    std::string call;    //!< the CUDA call ("cudaLaunchKernel", "cudaMemcpy", ...)
    std::string stream;  //!< the stream it used: "the legacy default stream", "stream 0x...", "" for none
    std::string problem; //!< what a capture would do with it
    std::string fix;
    //! Made by the trainer's own code between two regions of one graph (in_place_runner), not
    //! by a stage: `stage` then says between which.
    bool between_regions = false;
};

namespace detail {

inline std::string stream_words(cudaStream_t s, bool per_thread_variant) {
    if (s == nullptr) return per_thread_variant ? "the per-thread default stream" : "the legacy default stream (0)";
    if (s == cudaStreamLegacy) return "the legacy default stream (cudaStreamLegacy)";
    if (s == cudaStreamPerThread) return "the per-thread default stream";
    char text[32];
    std::snprintf(text, sizeof text, "stream %p", static_cast<void*>(s));
    return text;
}

class capture_doctor {
public:
    explicit capture_doctor(bool allocations_break_capture) : allocations_break_(allocations_break_capture) {}
    capture_doctor(const capture_doctor&) = delete;
    capture_doctor& operator=(const capture_doctor&) = delete;
    ~capture_doctor() { stop(); }

    //! Starts watching; false (and `unavailable()` says why) when CUPTI cannot be had: not
    //! installed, or another tool (a profiler, a sanitizer) holds its one subscriber.
    bool start() {
        const cupti_entry_points& e = cupti_entry_points::get();
        if (!e.missing.empty()) return fail(e.missing);
        thread_ = std::this_thread::get_id(); // before the first callback can come
        if (e.subscribe(&subscriber_, &capture_doctor::callback, this) != CUPTI_SUCCESS) {
            subscriber_ = nullptr;
            return fail("CUPTI has a subscriber already (a profiler or sanitizer)");
        }
        if (e.enable_domain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
            e.enable_domain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
            stop();
            return fail("CUPTI refused the runtime and driver callback domains");
        }
        return true;
    }
    void stop() noexcept {
        if (subscriber_) cupti_entry_points::get().unsubscribe(subscriber_);
        subscriber_ = nullptr;
    }
    const std::string& unavailable() const noexcept { return unavailable_; }

    //! The next calls belong to segments that will be captured (or not: those are not checked).
    void segment(bool captured) noexcept {
        captured_ = captured;
        records_.clear(); // a fork from an event an earlier stage of the segment recorded stays known
    }
    //! A stage's call begins on `given`.
    void enter(std::string_view stage, const void* call, cudaStream_t given) {
        stage_ = stage;
        call_ = call;
        depth_ = 0;
        streams_.assign(1, {given, false, 0});
        if (captured_) ++calls_watched_;
        in_call_.store(captured_, std::memory_order_relaxed);
    }
    //! The trainer's own code between two marked regions that one graph will hold
    //! (capscope/run/in_place_runner.hpp): any CUDA work there is a finding, as `label` says.
    //! `call` is the plan's call before the gap (its graph is the one refused).
    void enter_gap(std::string_view label, const void* call) {
        stage_ = label;
        call_ = call;
        depth_ = 0;
        streams_.clear();
        gap_ = true;
        in_call_.store(captured_, std::memory_order_relaxed);
    }
    //! The stage's call returned: work forked and not joined back is a finding.
    void leave() {
        if (gap_) {
            gap_ = false;
            in_call_.store(false, std::memory_order_relaxed);
            return;
        }
        if (in_call_.load(std::memory_order_relaxed))
            for (std::size_t i = 1; i < streams_.size(); ++i)
                if (streams_[i].pending)
                    add("(its return)", stream_words(streams_[i].stream, false),
                        "leaves work it forked onto " + stream_words(streams_[i].stream, false) + " unjoined when it returns, so a "
                        "capture would end with that stream still capturing (cudaErrorStreamCaptureUnjoined)",
                        "record an event on that stream after its last work and make the stream the stage was given wait for it "
                        "(cudaEventRecord, then cudaStreamWaitEvent) before returning");
        in_call_.store(false, std::memory_order_relaxed);
    }

    const std::vector<doctor_finding>& findings() const noexcept { return findings_; }
    //! Every call (the plan's `stage_call`) in which something was found.
    const std::vector<const void*>& refused_calls() const noexcept { return refused_calls_; }
    long calls_watched() const noexcept { return calls_watched_; }

private:
    struct tracked_stream {
        cudaStream_t stream;
        bool pending;      //!< forked, with work not yet joined back
        long last_work;    //!< sequence number of its last enqueue
    };
    struct recorded_event {
        cudaEvent_t event;
        cudaStream_t on;
        long seq;
    };

    bool fail(std::string why) {
        unavailable_ = std::move(why);
        return false;
    }
    tracked_stream* find(cudaStream_t s) {
        for (tracked_stream& t : streams_)
            if (t.stream == s) return &t;
        return nullptr;
    }
    void add(std::string call, std::string stream, std::string problem, std::string fix) {
        if (gap_) {
            problem = "is CUDA work outside any region, between two regions that one graph holds: captured, it would be replayed "
                      "with them, and your code would run it again after the graph's launch, out of order";
            fix = "mark this code as a region of its own (it then joins the graph in its place), or move it before the graph's first "
                  "region or after its last; host work there is fine";
        }
        for (const doctor_finding& f : findings_) // one finding per stage and problem
            if (f.stage == stage_ && f.call == call && f.stream == stream) {
                refused_calls_.push_back(call_); // (its graph in another microbatch, say)
                return;
            }
        findings_.push_back({std::string(stage_), std::move(call), std::move(stream), std::move(problem), std::move(fix), gap_});
        refused_calls_.push_back(call_);
    }

    //! Work enqueued on `s` (nullptr: the default stream, per thread when `ptsz`).
    void enqueue(const char* call, cudaStream_t s, bool ptsz) {
        ++seq_;
        if (s == nullptr && ptsz) s = cudaStreamPerThread; // 0 in a per-thread build
        if (gap_) return add(call, stream_words(s, false), "", "");
        if (tracked_stream* t = find(s)) { // the stream it was given (the per-thread default stream may be), or forked
            if (t != &streams_.front()) t->pending = true, t->last_work = seq_;
            return;
        }
        if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
            const bool legacy = s != cudaStreamPerThread; // 0 here is the legacy stream: a per-thread 0 became cudaStreamPerThread above
            add(call, stream_words(s, false),
                legacy ? "launches on the legacy default stream, which cannot be captured: the capture would be invalidated "
                         "(cudaErrorStreamCaptureImplicit), and a trainer whose error check exits would end there"
                       : "enqueues on the per-thread default stream, not on the stream it was given: captured, this work would run "
                         "once while capturing and be missing from every replay",
                "pass the stage's stream to this call (the stream_handle the stage is called with): kernel<<<grid, block, shared, "
                "stream>>>, cudaMemcpyAsync(..., stream), cublasSetStream(handle, stream)");
            return;
        }
        add(call, stream_words(s, false),
            "enqueues on " + stream_words(s, false) + ", a stream it was not given and did not fork from it: captured, this "
            "work would run once while capturing and be missing from every replay",
            "enqueue on the stream the stage is called with (a global stream of your own is the usual cause), or fork: record "
            "an event on the given stream and make the other stream wait for it first, and join it back before returning");
    }
    void record(cudaEvent_t e, cudaStream_t s, bool ptsz) {
        if (s == nullptr && ptsz) s = cudaStreamPerThread;
        if (gap_) return enqueue("cudaEventRecord", s, false);
        // Recording adds no work: on a stream of a library's own (NCCL's, eagerly) it is no offence,
        // and waiting for it orders the stage's stream after that stream, as it should.
        if (find(s)) enqueue("cudaEventRecord", s, ptsz);
        for (recorded_event& r : records_)
            if (r.event == e) {
                r = {e, s, seq_};
                return;
            }
        records_.push_back({e, s, seq_});
    }
    void wait(cudaStream_t s, cudaEvent_t e, bool ptsz) {
        if (s == nullptr && ptsz) s = cudaStreamPerThread;
        if (gap_) return enqueue("cudaStreamWaitEvent", s, false);
        const recorded_event* r = nullptr;
        for (const recorded_event& x : records_)
            if (x.event == e) r = &x;
        if (r && find(r->on) && !find(s) && s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread) {
            streams_.push_back({s, false, 0}); // forked from a stream the stage may use
            return;
        }
        enqueue("cudaStreamWaitEvent", s, ptsz);
        if (!r) return;
        tracked_stream* from = find(r->on);
        if (from && from != find(s) && r->seq >= from->last_work) from->pending = false; // joined back
    }
    void forbidden(const char* call, std::string problem, std::string fix) { add(call, "", std::move(problem), std::move(fix)); }

    void on_runtime(CUpti_CallbackId id, const void* p, const char* name) {
        using P = const void*;
        auto sync = [&](const char* what) {
            forbidden(name, std::string(what) + ": a capture refuses it (or, relaxed, it would run once while capturing and never again)",
                      "keep it out of the stage: do it once before the first step, or tag the stage synchronizes_with_host so the "
                      "plan keeps it out of graphs; use the Async form on the stage's stream where one exists");
        };
        switch (id) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
            return enqueue(name, static_cast<const cudaLaunchKernel_v7000_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
            return enqueue(name, static_cast<const cudaLaunchKernel_ptsz_v7000_params*>(P(p))->stream, true);
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
            if (const auto* c = static_cast<const cudaLaunchKernelExC_v11060_params*>(P(p))->config) enqueue(name, c->stream, false);
            return;
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
            if (const auto* c = static_cast<const cudaLaunchKernelExC_ptsz_v11060_params*>(P(p))->config) enqueue(name, c->stream, true);
            return;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
            return enqueue(name, static_cast<const cudaMemcpyAsync_v3020_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000:
            return enqueue(name, static_cast<const cudaMemcpyAsync_ptsz_v7000_params*>(P(p))->stream, true);
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
            return enqueue(name, static_cast<const cudaMemsetAsync_v3020_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000:
            return enqueue(name, static_cast<const cudaMemsetAsync_ptsz_v7000_params*>(P(p))->stream, true);
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchHostFunc_v10000:
            return enqueue(name, static_cast<const cudaLaunchHostFunc_v10000_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchHostFunc_ptsz_v10000:
            return enqueue(name, static_cast<const cudaLaunchHostFunc_ptsz_v10000_params*>(P(p))->stream, true);
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020:
            return enqueue(name, static_cast<const cudaMemcpy2DAsync_v3020_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
            return enqueue(name, static_cast<const cudaMallocAsync_v11020_params*>(P(p))->hStream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
            return enqueue(name, static_cast<const cudaFreeAsync_v11020_params*>(P(p))->hStream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000:
            return enqueue(name, static_cast<const cudaGraphLaunch_v10000_params*>(P(p))->stream, false);
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_v3020: {
            const auto* a = static_cast<const cudaEventRecord_v3020_params*>(P(p));
            return record(a->event, a->stream, false);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecord_ptsz_v7000: {
            const auto* a = static_cast<const cudaEventRecord_ptsz_v7000_params*>(P(p));
            return record(a->event, a->stream, true);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_v11010: {
            const auto* a = static_cast<const cudaEventRecordWithFlags_v11010_params*>(P(p));
            return record(a->event, a->stream, false);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventRecordWithFlags_ptsz_v11010: {
            const auto* a = static_cast<const cudaEventRecordWithFlags_ptsz_v11010_params*>(P(p));
            return record(a->event, a->stream, true);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020: {
            const auto* a = static_cast<const cudaStreamWaitEvent_v3020_params*>(P(p));
            return wait(a->stream, a->event, false);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_ptsz_v7000: {
            const auto* a = static_cast<const cudaStreamWaitEvent_ptsz_v7000_params*>(P(p));
            return wait(a->stream, a->event, true);
        }
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2D_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbol_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbol_v3020: return sync("makes a synchronous copy");
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000: return sync("sets memory synchronously (on a default stream)");
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000: return sync("synchronizes a stream with the host");
        case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020: return sync("synchronizes the device with the host");
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020: return sync("waits on the host for an event");
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventQuery_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_ptsz_v7000:
            return forbidden(name, "queries work in flight: a capture refuses it (cudaErrorStreamCaptureUnsupported), and a "
                                   "replay would not ask again",
                             "decide on the device (a guarded stage, capscope/stage/stage_guard.hpp), or tag the stage "
                             "synchronizes_with_host so the plan keeps it out of graphs");
        case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020:
        case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000:
            if (allocations_break_)
                forbidden(name, "allocates or frees memory: a capture in this capture_mode refuses it, and a replay would not allocate again",
                          "allocate once before the first step (or from capscope's scratch arena, or cudaMallocAsync on the stage's "
                          "stream, which a graph holds)");
            return;
        default: return;
        }
    }
    void on_driver(CUpti_CallbackId id, const void* p, const char* name) {
        using P = const void*;
        switch (id) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
            return enqueue(name, static_cast<const cuLaunchKernel_params*>(P(p))->hStream, false);
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
            return enqueue(name, static_cast<const cuLaunchKernel_ptsz_params*>(P(p))->hStream, true);
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
            if (const auto* c = static_cast<const cuLaunchKernelEx_params*>(P(p))->config) enqueue(name, c->hStream, false);
            return;
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
            if (const auto* c = static_cast<const cuLaunchKernelEx_ptsz_params*>(P(p))->config) enqueue(name, c->hStream, true);
            return;
        case CUPTI_DRIVER_TRACE_CBID_cuEventRecord: {
            const auto* a = static_cast<const cuEventRecord_params*>(P(p));
            return record(a->hEvent, a->hStream, false);
        }
        case CUPTI_DRIVER_TRACE_CBID_cuEventRecord_ptsz: {
            const auto* a = static_cast<const cuEventRecord_ptsz_params*>(P(p));
            return record(a->hEvent, a->hStream, true);
        }
        case CUPTI_DRIVER_TRACE_CBID_cuEventRecordWithFlags: {
            const auto* a = static_cast<const cuEventRecordWithFlags_params*>(P(p));
            return record(a->hEvent, a->hStream, false);
        }
        case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent: {
            const auto* a = static_cast<const cuStreamWaitEvent_params*>(P(p));
            return wait(a->hStream, a->hEvent, false);
        }
        case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz: {
            const auto* a = static_cast<const cuStreamWaitEvent_ptsz_params*>(P(p));
            return wait(a->hStream, a->hEvent, true);
        }
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchHostFunc:
            return enqueue(name, static_cast<const cuLaunchHostFunc_params*>(P(p))->hStream, false);
        case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
            if (allocations_break_)
                forbidden(name, "allocates or frees memory: a capture in this capture_mode refuses it, and a replay would not allocate again",
                          "allocate once before the first step (or cuMemAllocAsync on the stage's stream, which a graph holds)");
            return;
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
            return forbidden(name, "makes a synchronous copy: a capture refuses it", "use the Async form on the stage's stream");
        case CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize:
        case CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2:
        case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize:
        case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz:
        case CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize:
            return forbidden(name, "synchronizes with the host: a capture refuses it",
                             "keep it out of the stage, or tag the stage synchronizes_with_host so the plan keeps it out of graphs");
        case CUPTI_DRIVER_TRACE_CBID_cuEventQuery:
        case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery:
        case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery_ptsz:
            return forbidden(name, "queries work in flight: a capture refuses it",
                             "decide on the device (a guarded stage), or tag the stage synchronizes_with_host");
        default: return;
        }
    }

    static void CUPTIAPI callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
        auto& d = *static_cast<capture_doctor*>(self);
        // Another thread's call (a watchdog, NCCL's proxy), or capscope's own between stage calls.
        if (std::this_thread::get_id() != d.thread_ || !d.in_call_.load(std::memory_order_relaxed)) return;
        const auto* info = static_cast<const CUpti_CallbackData*>(data);
        const bool enter = info->callbackSite == CUPTI_API_ENTER;
        try { // nothing may be thrown through CUDA's own code
            if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
                if (enter && d.depth_ == 0) d.on_runtime(id, info->functionParams, info->functionName);
                d.depth_ += enter ? 1 : -1;
                return;
            }
            if (domain == CUPTI_CB_DOMAIN_DRIVER_API && enter && d.depth_ == 0) d.on_driver(id, info->functionParams, info->functionName);
        } catch (...) {
            d.in_call_.store(false, std::memory_order_relaxed); // out of memory: stop watching this call rather than crash
        }
    }

    CUpti_SubscriberHandle subscriber_ = nullptr;
    std::string unavailable_;
    std::thread::id thread_;
    bool allocations_break_;
    bool captured_ = false;
    bool gap_ = false; //!< watching the trainer's code between two regions of one graph (enter_gap)
    std::atomic<bool> in_call_{false};
    int depth_ = 0; //!< runtime calls in progress (the driver calls inside them are the runtime's own)
    std::string_view stage_;
    std::vector<tracked_stream> streams_; //!< [0]: the stream the stage was given; then those it forked
    std::vector<recorded_event> records_;
    long seq_ = 0, calls_watched_ = 0;
    std::vector<doctor_finding> findings_;
    std::vector<const void*> refused_calls_;
    const void* call_ = nullptr;
};

} // namespace detail
} // namespace capscope
