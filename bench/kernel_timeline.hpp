#pragma once
// Where a step's time goes, from CUPTI while tracing is on (bench/data_parallel): every kernel's
// and copy's start and end on the device (activity API), communication told from the compute
// kernels by name (NCCL's kernels, and capscope_mem_ops, which runs the waits that order its
// copy-engine collectives in graph copies: cuda/mem_op_kernel.hpp), and optionally the host's time
// in each CUDA call made on the tracing thread (callback API; driver calls made inside a runtime
// call are the runtime's own and are not counted again). The summary says how much of the
// communication no compute kernel overlaps (what a step waits for the link or the other rank),
// how long no kernel runs (memsets and memory-operation nodes are not traced: they count there),
// how much of the copies no kernel overlaps, and which calls the host spent the step in.
// Tracing costs time itself: use it for the breakdown, and time the steps without it.

#include "api_counter.hpp" // BENCH_CUPTI

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bench {

struct kernel_span {
    std::uint64_t start, end;
    bool nccl; //!< communication: NCCL's kernels and capscope_mem_ops (its copy-engine collectives' waits)
    std::string name; //!< demangled, without template and function arguments
};

class kernel_timeline {
public:
    //! Starts tracing kernels and copies, and with `host_calls` the calling thread's CUDA calls
    //! (which slows the host more). One timeline at a time.
    void start(bool host_calls = true) {
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            kernels_.clear();
            copies_.clear();
            dropped_ = 0;
        }
        host_.clear();
        depth_ = 0;
        active().store(this);
        thread_ = std::this_thread::get_id();
        BENCH_CUPTI(cuptiActivityRegisterCallbacks(&kernel_timeline::buffer_requested, &kernel_timeline::buffer_completed));
        BENCH_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
        BENCH_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));  // copies on copy engines,
        BENCH_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2)); // peer to peer too (NCCL's)
        if (!host_calls) return;
        BENCH_CUPTI(cuptiSubscribe(&subscriber_, &kernel_timeline::callback, this));
        subscribed_ = true;
        BENCH_CUPTI(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API));
        BENCH_CUPTI(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API));
    }
    kernel_timeline() = default;
    kernel_timeline(const kernel_timeline&) = delete;
    kernel_timeline& operator=(const kernel_timeline&) = delete;
    //! Left while tracing (a step threw): tracing stops, so CUPTI's buffers never reach a timeline that is gone.
    ~kernel_timeline() {
        if (active().load() != this) return;
        if (subscribed_) (void)cuptiUnsubscribe(subscriber_);
        (void)cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        (void)cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
        (void)cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY2);
        (void)cuptiActivityFlushAll(1);
        active().store(nullptr);
    }
    //! Stops tracing; every kernel record is in once this returns.
    void stop() {
        if (subscribed_) BENCH_CUPTI(cuptiUnsubscribe(subscriber_));
        subscribed_ = false;
        BENCH_CUPTI(cuptiActivityFlushAll(1));
        BENCH_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
        BENCH_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY));
        BENCH_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY2));
        BENCH_CUPTI(cuptiActivityFlushAll(1));
        active().store(nullptr);
    }

    //! Where a step's time went, in ms per step (the traced steps run slower than untraced ones).
    //! NaN where nothing was traced, or CUPTI dropped records.
    struct step_breakdown {
        double span = NAN;          //!< from the first kernel's start to the last one's end, per step
        double compute = NAN;       //!< compute kernels busy
        double communication = NAN; //!< NCCL's kernels and capscope_mem_ops busy
        double exposed = NAN;       //!< communication with no compute kernel beside it
        double idle = NAN;          //!< no kernel running (copies alone, waits, launch gaps)
        double copies = NAN;        //!< copies busy (copy-engine collectives among them)
        double copies_alone = NAN;  //!< copies with no kernel beside them
    };
    //! The breakdown over `steps` traced steps.
    step_breakdown breakdown(int steps) {
        const std::lock_guard<std::mutex> lock(mutex_);
        return dropped_ > 0 ? step_breakdown{} : breakdown_locked(steps);
    }

    //! The breakdown per step, over `steps` traced steps, as lines prefixed by `prefix`.
    void print(int steps, const char* prefix) {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (dropped_ > 0) std::printf("%sCUPTI dropped %zu kernel records: the figures below are incomplete\n", prefix, dropped_);
        if (kernels_.empty()) {
            std::printf("%sno kernels traced\n", prefix);
            return;
        }
        const step_breakdown b = breakdown_locked(steps);
        std::printf("%sper step, over %d steps: span %.3f ms; compute kernels busy %.3f ms; NCCL kernels (and capscope_mem_ops) %.3f ms, of which no compute "
                    "kernel overlaps %.3f ms; no kernel running %.3f ms\n",
                    prefix, steps, b.span, b.compute, b.communication, b.exposed, b.idle);
        // Copies (copy engines: NCCL's copy-engine collectives among them), and how much of them
        // no kernel overlaps.
        std::printf("%scopies busy %.3f ms a step, of which no kernel overlaps %.3f ms\n", prefix, b.copies, b.copies_alone);
        const double per = 1e6 * steps; // ns in all steps -> ms per step
        const spans copies = merged(copies_);
        // Where no kernel runs: each gap between kernels, named by the kernel that ended last before
        // it and the one that starts after it, summed over the steps (with how much copies fill).
        std::vector<const kernel_span*> order;
        for (const auto& k : kernels_) order.push_back(&k);
        std::sort(order.begin(), order.end(), [](const kernel_span* a, const kernel_span* b) { return a->start < b->start; });
        std::map<std::string, std::tuple<std::uint64_t, std::uint64_t, long>> gaps; // "before -> after": ns, ns filled by copies, count
        const kernel_span* last = order.front();
        for (const kernel_span* k : order) {
            if (k->start > last->end && k->start - last->end >= 2000) { // gaps of 2 us and more
                auto& [ns, filled, count] = gaps[last->name + " -> " + k->name];
                ns += k->start - last->end;
                filled += covered(copies, last->end, k->start);
                ++count;
            }
            if (k->end > last->end) last = k;
        }
        std::vector<std::pair<std::uint64_t, std::string>> worst;
        for (const auto& [pair, t] : gaps) {
            char line[96];
            std::snprintf(line, sizeof line, " (x%.1f, copies in %.3f ms)", double(std::get<2>(t)) / steps, std::get<1>(t) / per);
            worst.emplace_back(std::get<0>(t), pair + line);
        }
        std::sort(worst.rbegin(), worst.rend());
        std::printf("%sno kernel running, per step, the longest gaps of 2 us or more by the kernels around them:\n", prefix);
        for (std::size_t i = 0; i < worst.size() && i < 8; ++i) std::printf("%s  %.3f ms  %s\n", prefix, worst[i].first / per, worst[i].second.c_str());
        std::map<std::string, std::pair<std::uint64_t, long>> by_name; // the same function may come by two name pointers
        for (const auto& [name, t] : host_) {
            auto& [ns, count] = by_name[name];
            ns += t.first;
            count += t.second;
        }
        std::vector<std::pair<std::uint64_t, std::string>> calls;
        for (const auto& [name, t] : by_name) {
            char calls_per_step[32];
            std::snprintf(calls_per_step, sizeof calls_per_step, " x%.1f", double(t.second) / steps);
            calls.emplace_back(t.first, name + calls_per_step);
        }
        std::sort(calls.rbegin(), calls.rend());
        std::printf("%shost, per step, the CUDA calls that took longest:", prefix);
        for (std::size_t i = 0; i < calls.size() && i < 6; ++i) std::printf(" %s %.3f ms;", calls[i].second.c_str(), calls[i].first / per);
        std::printf("\n");
    }

private:
    //! (With records dropped, what was traced: print warns, breakdown gives NaN.)
    step_breakdown breakdown_locked(int steps) const {
        step_breakdown b;
        if (kernels_.empty() || steps <= 0) return b;
        spans compute, communication, all;
        for (const auto& k : kernels_) {
            (k.nccl ? communication : compute).emplace_back(k.start, k.end);
            all.emplace_back(k.start, k.end);
        }
        compute = merged(std::move(compute));
        communication = merged(std::move(communication));
        all = merged(std::move(all));
        const double per = 1e6 * steps; // ns in all steps -> ms per step
        const std::uint64_t span = all.back().second - all.front().first;
        std::uint64_t busy = 0, exposed = 0;
        for (const auto& [s, e] : communication) {
            busy += e - s;
            exposed += (e - s) - covered(compute, s, e);
        }
        b.span = span / per;
        b.compute = length(compute) / per;
        b.communication = busy / per;
        b.exposed = exposed / per;
        b.idle = (span - length(all)) / per;
        const spans copies = merged(copies_);
        std::uint64_t alone = 0;
        for (const auto& [s, e] : copies) alone += (e - s) - covered(all, s, e);
        b.copies = length(copies) / per;
        b.copies_alone = alone / per;
        return b;
    }
    bool subscribed_ = false; //!< the host calls are traced (start(true))
    using spans = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
    static spans merged(spans v) {
        std::sort(v.begin(), v.end());
        spans out;
        for (const auto& [s, e] : v)
            if (!out.empty() && s <= out.back().second)
                out.back().second = std::max(out.back().second, e);
            else
                out.emplace_back(s, e);
        return out;
    }
    static std::uint64_t length(const spans& v) {
        std::uint64_t t = 0;
        for (const auto& [s, e] : v) t += e - s;
        return t;
    }
    //! How much of [s, e) the merged spans cover.
    static std::uint64_t covered(const spans& v, std::uint64_t s, std::uint64_t e) {
        auto it = std::upper_bound(v.begin(), v.end(), std::make_pair(s, UINT64_MAX));
        if (it != v.begin()) --it;
        std::uint64_t t = 0;
        for (; it != v.end() && it->first < e; ++it) {
            const std::uint64_t a = std::max(s, it->first), b = std::min(e, it->second);
            if (b > a) t += b - a;
        }
        return t;
    }

    //! "void ns::kernel<...>(args)" -> "ns::kernel": enough to tell the kernels apart.
    static std::string short_name(const std::string& mangled) {
        int status = 0;
        char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
        std::string n = status == 0 && d ? d : mangled;
        std::free(d);
        if (n.starts_with("void ")) n.erase(0, 5);
        // The example model's kernels sit in an anonymous namespace: its "(" is not the arguments'.
        for (std::size_t at; (at = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(at, 23);
        n = n.substr(0, n.find_first_of("<("));
        return n.size() > 48 ? n.substr(0, 48) : n;
    }
    //! The timeline being filled: CUPTI's buffer callbacks run on a thread of its own.
    static std::atomic<kernel_timeline*>& active() {
        static std::atomic<kernel_timeline*> t{nullptr};
        return t;
    }
    static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
        *size = 8 << 20;
        *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size)); // null: CUPTI drops the records, and counts them
        if (!*buffer) *size = 0;
        *max_records = 0;
    }
    static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
        kernel_timeline* t = active().load();
        std::size_t dropped = 0;
        if (t && cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped > 0) {
            const std::lock_guard<std::mutex> lock(t->mutex_);
            t->dropped_ += dropped;
        }
        CUpti_Activity* record = nullptr;
        while (t && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
            if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY || record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {
                std::uint64_t start, end;
                if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
                    const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
                    start = c->start, end = c->end;
                } else {
                    const auto* c = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
                    start = c->start, end = c->end;
                }
                const std::lock_guard<std::mutex> lock(t->mutex_);
                t->copies_.emplace_back(start, end);
                continue;
            }
            if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            const std::string name = k->name ? k->name : "";
            const std::lock_guard<std::mutex> lock(t->mutex_);
            // NCCL's, and the kernels that run its copy-engine collectives' ordering waits in graph
            // copies (cuda/mem_op_kernel.hpp): time a rank waits for its peers.
            const bool communication = name.find("nccl") != std::string::npos || name == "capscope_mem_ops";
            t->kernels_.push_back({k->start, k->end, communication, short_name(name)});
        }
        std::free(buffer);
    }
    static void CUPTIAPI callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
        auto& t = *static_cast<kernel_timeline*>(self);
        if (std::this_thread::get_id() != t.thread_) return; // NCCL's and CUPTI's own threads
        const auto* info = static_cast<const CUpti_CallbackData*>(data);
        const bool enter = info->callbackSite == CUPTI_API_ENTER;
        const bool runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
        if (!runtime && t.depth_ > 0) return; // the runtime's own driver calls
        std::uint64_t now = 0;
        cuptiGetTimestamp(&now);
        if (enter) { // CUPTI keeps a word per call for its entry and exit callbacks
            if (runtime) ++t.depth_;
            *info->correlationData = now;
            return;
        }
        if (runtime) --t.depth_;
        auto& [total, count] = t.host_[info->functionName]; // a static name: its pointer is the key
        total += now - *info->correlationData;
        ++count;
    }

    std::mutex mutex_; // kernels_ and dropped_, filled on CUPTI's thread
    std::vector<kernel_span> kernels_;
    spans copies_;
    std::size_t dropped_ = 0;
    std::unordered_map<const char*, std::pair<std::uint64_t, long>> host_; // the tracing thread's: function -> (ns, calls)
    int depth_ = 0;
    std::thread::id thread_;
    CUpti_SubscriberHandle subscriber_{};
};

} // namespace bench
