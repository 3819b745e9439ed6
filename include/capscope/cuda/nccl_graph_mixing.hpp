#pragma once
//! @file
//! NCCL's rules for graphs when its graph-mixing support is off, kept by construction.
//!
//! NCCL's graph-mixing support (`NCCL_GRAPH_MIXING_SUPPORT`, on by default) orders the work it
//! captures into graphs against its eager work with one event: a wait on it at each graph's root
//! and a record of it after each captured collective (`src/misc/strongstream.cc`, v2.28.3). Each
//! such node costs the host about a microsecond at every launch, also after a copy thins the
//! records (docs/performance.md). With the support off (`NCCL_GRAPH_MIXING_SUPPORT=0`), NCCL's
//! documentation says a communicator is correct only if
//!   (1) no two graph launches that use it are outstanding on different streams without a
//!       dependency between them, and
//!   (2) no eager NCCL call follows a graph launch that has not finished, whatever the streams
//!       (an eager call hands its proxy work to NCCL's thread at once, a graph's when it runs).
//! And NCCL uploads a captured plan too large for the kernel's arguments on a stream of its own,
//! which only the graph-mixing wait orders before the graph's first launch (`src/enqueue.cc`).
//!
//! `nccl_launch_order` keeps all three, and one more that only the graph-mixing wait kept: a graph
//! launched after an eager NCCL call on another stream runs after it. capscope calls it where it
//! launches graphs that hold collective calls and where it makes such calls eagerly: `runner`,
//! `in_place_runner`, the inference runners (`bucket_runner`), `pipeline_phase_graphs`,
//! `pipeline_p2p` and `nccl_communicator::average_in_place`. With the support on, each call is
//! one branch on a flag read once. With it off, per device:
//!   - before launching a graph that holds NCCL work, a wait (on the device) for the last NCCL work
//!     if that was on another stream;
//!   - after capturing one, a wait for the device (set-up, once per capture), for NCCL's upload;
//!   - before an eager NCCL call, a wait on the host for the last graph launch holding NCCL work,
//!     and an event recorded after the call.
//! A copied graph (graph_copy.hpp) records its own end, so its launch records no event; a graph
//! kept as captured has one recorded after it. Each launch asks the stream's id and device.
//!
//! What it cannot see: NCCL work it is not told of. That includes graphs the trainer captures
//! itself, `pipeline_pass_graphs`' passes (which hold no collective by their contract), and NCCL
//! calls outside capscope's stages (a loss all-reduce after `step()`). With the support off, such
//! code calls `launch`, `captured` and `eager` itself.
//! The state is per device and process-wide, so a trainer may move between threads. One thread
//! driving several GPUs' ranks (`nccl_communicator::for_devices`) must launch every rank's graph
//! before an eager call on any of them: that call waits on the host for its rank's graph, which
//! waits for its peers'. That is NCCL's own rule 2.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/detail/breakage.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace capscope::cuda {

//! NCCL's reading of `NCCL_GRAPH_MIXING_SUPPORT`'s value (`ncclLoadParam`, v2.28.3): unset or
//! empty is the default, on; otherwise `strtoll(value, nullptr, 0)`, whatever follows the number,
//! and the default only where that overflows. So "0", "off" and "false" all read as 0: off.
inline bool nccl_graph_mixing_from(const char* value) noexcept {
    if (!value || !*value) return true;
    errno = 0;
    const long long n = std::strtoll(value, nullptr, 0);
    if (errno) return true;
    return n != 0;
}

//! Whether NCCL orders its captured work against its eager work in this process: read from the
//! environment, where NCCL also puts what `nccl.conf` sets once it has initialised.
inline bool nccl_graph_mixing() noexcept { return nccl_graph_mixing_from(std::getenv("NCCL_GRAPH_MIXING_SUPPORT")); }

//! What `nccl_launch_order` did, over every device of the process.
struct nccl_order_counts {
    long host_waits = 0;      //!< eager NCCL calls held until the last graph holding NCCL work had finished
    long stream_waits = 0;    //!< launches made to wait on the device for NCCL work on another stream
    long capture_waits = 0;   //!< captures of NCCL work followed by a wait for the device
    long events_recorded = 0; //!< events recorded after eager calls and after graphs that record no end of their own
};

namespace detail {
//! The last NCCL work on one device: a graph launch or an eager call, where, and what says it
//! finished.
struct last_nccl_work {
    std::mutex mutex;
    bool pending = false;
    bool graph = false; //!< a graph launch (an eager call else)
    unsigned long long stream_id = 0;
    cudaEvent_t finished = nullptr;
    //! What keeps a copy's event alive (graph_exec::keeps_alive), watched, not held: holding it
    //! would keep NCCL's plans (the source graph's user objects) past their communicator's end.
    //! Once it is gone, the copy's last launch has finished (graph_copy.hpp's kept_source waits).
    std::weak_ptr<const void> keeps_finished;
    bool own_event = false;    //!< `finished` is `own`, not a copy's
    std::optional<event> own;  //!< recorded after eager calls and uncopied graphs; made on the device at first need
    nccl_order_counts counts;
};
inline constexpr int nccl_order_devices = 64;
inline std::array<last_nccl_work, nccl_order_devices>& nccl_work_by_device() noexcept {
    static std::array<last_nccl_work, nccl_order_devices> state;
    return state;
}
inline int device_of(cudaStream_t s) {
    int d = 0;
    if (s) CAPSCOPE_CHECK(cudaStreamGetDevice(s, &d));
    else CAPSCOPE_CHECK(cudaGetDevice(&d));
    if (d < 0 || d >= nccl_order_devices)
        throw std::out_of_range("capscope: nccl_launch_order keeps devices 0 to " + std::to_string(nccl_order_devices - 1) + "; this is device " + std::to_string(d));
    return d;
}
inline unsigned long long stream_id(cudaStream_t s) {
    unsigned long long id = 0;
    CAPSCOPE_CHECK(cudaStreamGetId(s, &id));
    return id;
}
inline bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &status));
    return status != cudaStreamCaptureStatusNone;
}
//! `w.own`, made on device `d` if not yet (set-up: once per device).
inline const event& own_event_of(last_nccl_work& w, int d) {
    if (w.own) return *w.own;
    int current = 0;
    CAPSCOPE_CHECK(cudaGetDevice(&current));
    if (current != d) CAPSCOPE_CHECK(cudaSetDevice(d));
    try {
        w.own.emplace();
    } catch (...) {
        if (current != d) (void)cudaSetDevice(current);
        throw;
    }
    if (current != d) CAPSCOPE_CHECK(cudaSetDevice(current));
    return *w.own;
}
//! Makes `s` wait for `w`'s last work if it is pending on another stream than `id` (and alive).
inline void follow_on_device(last_nccl_work& w, cudaStream_t s, unsigned long long id) {
    if (!w.pending || w.stream_id == id) return;
    const std::shared_ptr<const void> alive = w.keeps_finished.lock();
    if (!w.own_event && !alive) return; // the copy is gone, and its end was waited for
    CAPSCOPE_CHECK(cudaStreamWaitEvent(s, w.finished, 0));
    ++w.counts.stream_waits;
}
} // namespace detail

//! Keeps NCCL's rules for graphs when its graph-mixing support is off (see the file's comment);
//! does nothing when it is on. Reads the setting at its first call, so after the communicators
//! are made (NCCL has then loaded `nccl.conf`). Cheap to make: hold one where graphs are launched.
class nccl_launch_order {
public:
    nccl_launch_order() = default;
    //! For tests and benches: the setting given, not read.
    explicit nccl_launch_order(bool mixing) noexcept : state_(mixing ? on : off) {}

    //! Whether these rules are kept here (NCCL's graph-mixing support is off).
    bool kept() const noexcept {
        if (state_ == unread) state_ = nccl_graph_mixing() ? on : off;
        return state_ == off && !capscope::detail::installed_breakage().nccl_order_skipped;
    }

    //! After a graph holding NCCL work was captured, before its first launch: NCCL's upload of a
    //! large plan (on a stream of its own) finished. (In relaxed capture mode, so that another
    //! thread's capture does not make the wait illegal.)
    void captured() const {
        if (!kept()) return;
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        CAPSCOPE_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        const cudaError_t waited = cudaDeviceSynchronize();
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        CAPSCOPE_CHECK(waited);
        detail::last_nccl_work& w = detail::nccl_work_by_device()[std::size_t(detail::device_of(nullptr))];
        const std::lock_guard<std::mutex> lock(w.mutex);
        ++w.counts.capture_waits;
    }

    //! Launches `g`, which holds NCCL work, on `s`: after the last NCCL work if that was on another
    //! stream (rule 1, and an eager call before), and noted for the next eager call (rule 2).
    void launch(const graph_exec& g, cudaStream_t s) const {
        if (!kept()) return g.launch(s);
        const int d = detail::device_of(s);
        detail::last_nccl_work& w = detail::nccl_work_by_device()[std::size_t(d)];
        const std::lock_guard<std::mutex> lock(w.mutex);
        const unsigned long long id = detail::stream_id(s);
        const event* own = g.finished_event() ? nullptr : &detail::own_event_of(w, d); // (made before the launch)
        detail::follow_on_device(w, s, id);
        g.launch(s);
        w.pending = true;
        w.graph = true;
        w.stream_id = id;
        if (!own) {
            w.finished = g.finished_event();
            w.keeps_finished = g.keeps_alive();
            w.own_event = false;
            return;
        }
        w.finished = own->get();
        w.keeps_finished.reset();
        w.own_event = true;
        own->record(s);
        ++w.counts.events_recorded;
    }

    //! Before an eager NCCL call on `s`: the last launch of a graph holding NCCL work has finished
    //! (rule 2). Under capture there is nothing to wait for. `s` may be null: the current device.
    void before_eager(cudaStream_t s = nullptr) const {
        if (!kept()) return;
        if (s && detail::capturing(s)) return;
        detail::last_nccl_work& w = detail::nccl_work_by_device()[std::size_t(detail::device_of(s))];
        const std::lock_guard<std::mutex> lock(w.mutex);
        if (!w.pending || !w.graph) return;
        const std::shared_ptr<const void> alive = w.keeps_finished.lock();
        if (w.own_event || alive) { // (else the copy is gone, and its end was waited for)
            CAPSCOPE_CHECK(cudaEventSynchronize(w.finished));
            ++w.counts.host_waits;
        }
        w.pending = false;
        w.keeps_finished.reset();
    }

    //! After an eager NCCL call on `s`: noted, so that a graph launched on another stream follows it.
    void after_eager(cudaStream_t s) const {
        if (!kept() || detail::capturing(s)) return;
        const int d = detail::device_of(s);
        detail::last_nccl_work& w = detail::nccl_work_by_device()[std::size_t(d)];
        const std::lock_guard<std::mutex> lock(w.mutex);
        const event& own = detail::own_event_of(w, d);
        own.record(s);
        w.pending = true;
        w.graph = false;
        w.stream_id = detail::stream_id(s);
        w.finished = own.get();
        w.keeps_finished.reset();
        w.own_event = true;
        ++w.counts.events_recorded;
    }

    //! `calls()`, which makes NCCL calls on `s` (eagerly or under capture), between
    //! `before_eager(s)` and `after_eager(s)`.
    template <class Calls>
    void eager(cudaStream_t s, Calls&& calls) const {
        before_eager(s);
        calls();
        after_eager(s);
    }

    //! What the orders of every device added so far.
    static nccl_order_counts counts() {
        nccl_order_counts sum;
        for (detail::last_nccl_work& w : detail::nccl_work_by_device()) {
            const std::lock_guard<std::mutex> lock(w.mutex);
            sum.host_waits += w.counts.host_waits;
            sum.stream_waits += w.counts.stream_waits;
            sum.capture_waits += w.counts.capture_waits;
            sum.events_recorded += w.counts.events_recorded;
        }
        return sum;
    }

private:
    enum : signed char { unread, on, off };
    mutable signed char state_ = unread;
};

} // namespace capscope::cuda
