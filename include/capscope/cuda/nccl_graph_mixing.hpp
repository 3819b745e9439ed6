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
//! `nccl_launch_order` keeps all three for whoever calls it at those points; capscope's runners,
//! pipeline phases and point-to-point passes do. With the support on, each call is one branch on a
//! flag read once. With it off: before launching a graph that holds NCCL work, a wait (on the
//! device) for the last such launch if that was on another stream; after capturing one, a wait for
//! the device (set-up, once per capture); before an eager NCCL call, a wait on the host for the last
//! such launch. A copied graph (graph_copy.hpp) records its own end, so its launch adds no call;
//! a graph kept as captured has an event recorded after it. No allocation on the replay path.
//!
//! What it cannot see: NCCL calls the trainer makes outside capscope's stages (an
//! `in_place_runner`'s regions, a loss all-reduce after `step()`). With the support off, those
//! must keep (1) and (2) themselves; `nccl_launch_order::before_eager` is the call that does.
//! The state is per host thread (NCCL allows one thread per communicator), across communicators:
//! a wait for one communicator's graph before another's eager call is more than NCCL needs, never
//! less.

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/detail/breakage.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace capscope::cuda {

//! NCCL's reading of `NCCL_GRAPH_MIXING_SUPPORT`'s value (`NCCL_PARAM`: unset or empty is the
//! default, 1; otherwise a number, strtoll base 0, nonzero meaning on; text that is no number reads
//! as the default too, as NCCL warns and keeps it).
inline bool nccl_graph_mixing_from(const char* value) noexcept {
    if (!value || !*value) return true;
    char* end = nullptr;
    const long long n = std::strtoll(value, &end, 0);
    if (end == value || *end != '\0') return true;
    return n != 0;
}

//! Whether NCCL orders its captured work against its eager work in this process: read from the
//! environment, where NCCL also puts what `nccl.conf` sets once it has initialised.
inline bool nccl_graph_mixing() noexcept { return nccl_graph_mixing_from(std::getenv("NCCL_GRAPH_MIXING_SUPPORT")); }

//! What `nccl_launch_order` did: waits it added, counted per host thread.
struct nccl_order_counts {
    long host_waits = 0;    //!< eager NCCL calls held until the last graph holding NCCL work had finished
    long stream_waits = 0;  //!< launches made to wait on the device for one on another stream
    long capture_waits = 0; //!< captures of NCCL work followed by a wait for the device
    long events_recorded = 0; //!< launches of graphs that record no end of their own, an event recorded after them
};

namespace detail {
//! The last launch of a graph holding NCCL work on this thread: where, and what says it finished.
struct last_nccl_launch {
    bool pending = false;
    unsigned long long stream_id = 0;
    int device = -1;
    cudaEvent_t finished = nullptr;
    //! What keeps a copy's event alive (graph_exec::keeps_alive), watched, not held: holding it
    //! would keep NCCL's plans (the source graph's user objects) past their communicator's end.
    //! Once it is gone, the copy's last launch has finished (graph_copy.hpp's kept_source waits).
    std::weak_ptr<const void> keeps_finished;
    bool own_event = false; //!< `finished` is one of `own_events` below, not a copy's
    nccl_order_counts counts;
    //! Events recorded after graphs that record no end of their own, one per device, made at first use.
    std::array<std::optional<event>, 64> own_events;
};
inline last_nccl_launch& thread_nccl_launch() noexcept {
    static thread_local last_nccl_launch state;
    return state;
}
inline unsigned long long stream_id(cudaStream_t s) {
    unsigned long long id = 0;
    CAPSCOPE_CHECK(cudaStreamGetId(s, &id));
    return id;
}
inline int current_device() {
    int d = 0;
    CAPSCOPE_CHECK(cudaGetDevice(&d));
    return d;
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
    //! large plan (on a stream of its own) finished.
    void captured() const {
        if (!kept()) return;
        CAPSCOPE_CHECK(cudaDeviceSynchronize());
        ++detail::thread_nccl_launch().counts.capture_waits;
    }

    //! Launches `g`, which holds NCCL work, on `s`: after the last such launch if that was on
    //! another stream (rule 1), and noted for the next eager call (rule 2).
    void launch(const graph_exec& g, cudaStream_t s) const {
        if (!kept()) return g.launch(s);
        detail::last_nccl_launch& last = detail::thread_nccl_launch();
        const unsigned long long id = detail::stream_id(s);
        if (last.pending && last.stream_id != id) {
            const std::shared_ptr<const void> alive = last.keeps_finished.lock();
            if (last.own_event || alive) { // (else the copy is gone, and its end was waited for)
                CAPSCOPE_CHECK(cudaStreamWaitEvent(s, last.finished, 0));
                ++last.counts.stream_waits;
            }
        }
        g.launch(s);
        if (g.finished_event()) {
            last.finished = g.finished_event();
            last.keeps_finished = g.keeps_alive();
            last.own_event = false;
        } else {
            const int device = detail::current_device();
            if (device < 0 || std::size_t(device) >= last.own_events.size())
                throw std::out_of_range("capscope: nccl_launch_order keeps an event for devices 0 to 63; this is device " + std::to_string(device));
            std::optional<event>& e = last.own_events[std::size_t(device)];
            if (!e) e.emplace();
            e->record(s);
            last.finished = e->get();
            last.keeps_finished.reset();
            last.own_event = true;
            ++last.counts.events_recorded;
        }
        last.pending = true;
        last.stream_id = id;
    }

    //! Before an eager NCCL call: the last launch of a graph holding NCCL work has finished.
    //! `s`, when given, is the call's stream: under capture there is nothing to wait for.
    void before_eager(cudaStream_t s = nullptr) const {
        if (!kept()) return;
        detail::last_nccl_launch& last = detail::thread_nccl_launch();
        if (!last.pending) return;
        if (s) {
            cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
            CAPSCOPE_CHECK(cudaStreamIsCapturing(s, &status));
            if (status != cudaStreamCaptureStatusNone) return;
        }
        const std::shared_ptr<const void> alive = last.keeps_finished.lock();
        if (last.own_event || alive) { // (else the copy is gone, and its end was waited for)
            CAPSCOPE_CHECK(cudaEventSynchronize(last.finished));
            ++last.counts.host_waits;
        }
        last.pending = false;
        last.keeps_finished.reset();
    }

    //! What this thread's orders added so far.
    static nccl_order_counts counts() noexcept { return detail::thread_nccl_launch().counts; }

private:
    enum : signed char { unread, on, off };
    mutable signed char state_ = unread;
};

} // namespace capscope::cuda
