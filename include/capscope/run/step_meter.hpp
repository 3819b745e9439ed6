#pragma once
//! @file
//! Measuring a trainer's own step, with no bench code copied: `time_round_robin` times several
//! ways of running a step side by side in one process (round after round, so drift hits them
//! alike), per step the device time between CUDA events and the host time of the enqueueing call;
//! `api_counter` counts the CUDA API calls a piece of work makes (CUPTI's callbacks, loaded at run
//! time). Counting is a pass of its own: the callbacks cost host time.
//!
//!     struct way { const char* name; std::function<void(cudaStream_t)> step; std::vector<float> device_ms, host_us; };
//!     std::vector<way> ways = {{"own loop", ...}, {"whole step", ...}};
//!     capscope::step_meter::time_round_robin(ways, 7, 10, stream);
//!     capscope::step_meter::median(ways[0].device_ms);             // ms per step
//!     capscope::step_meter::api_counter().count([&] { ways[1].step(stream); }).total();

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/run/cupti_loader.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace capscope::step_meter {

//! The median (the mean of the two middle values for an even count; 0 for none).
template <class T>
double median(std::vector<T> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : (v.size() % 2 ? double(v[v.size() / 2]) : 0.5 * (double(v[v.size() / 2 - 1]) + double(v[v.size() / 2])));
}

//! `rounds` rounds; in each, `steps_per_round` steps of every way in turn. A way has
//! `step(cudaStream_t)` and the vectors `device_ms` and `host_us` (floats) it appends to, one entry
//! per step.
template <class Way>
void time_round_robin(std::vector<Way>& ways, int rounds, int steps_per_round, cudaStream_t s) {
    std::vector<cuda::event> marks;
    for (int i = 0; i <= steps_per_round; ++i) marks.push_back(cuda::event::timing());
    for (int round = 0; round < rounds; ++round)
        for (auto& x : ways) {
            marks[0].record(s);
            for (int i = 0; i < steps_per_round; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                x.step(s);
                const auto t1 = std::chrono::steady_clock::now();
                marks[std::size_t(i) + 1].record(s);
                x.host_us.push_back(float(std::chrono::duration<double, std::micro>(t1 - t0).count()));
            }
            marks[std::size_t(steps_per_round)].synchronize();
            for (int i = 0; i < steps_per_round; ++i)
                x.device_ms.push_back(cuda::event::elapsed_ms(marks[std::size_t(i)], marks[std::size_t(i) + 1]));
        }
}

//! What a piece of work called.
struct api_calls {
    std::map<std::string, long> runtime; //!< runtime API calls, by function
    std::map<std::string, long> driver;  //!< driver API calls made directly (not inside a runtime call), by function
    long launches = 0;                   //!< kernel and graph launches, through either API

    static long total(const std::map<std::string, long>& calls) {
        long n = 0;
        for (const auto& [name, k] : calls) n += k;
        return n;
    }
    //! Every call: runtime calls, and driver calls made directly (cuBLAS launches through the driver).
    long total() const { return total(runtime) + total(driver); }
    //! " cudaGraphLaunch ×28 ...; driver: cuKernelGetName ×2": every function and its count.
    std::string by_function() const {
        std::string s;
        for (const auto& [name, n] : runtime) s += " " + name + " ×" + std::to_string(n);
        if (!driver.empty()) s += "; driver:";
        for (const auto& [name, n] : driver) s += " " + name + " ×" + std::to_string(n);
        return s;
    }
};

//! Counts CUDA API calls with CUPTI's callback API while `count` runs its work: every entry into a
//! runtime function, and every driver function called directly, by the thread that called
//! `count`; driver calls made inside a runtime call are the runtime's own work and are not counted
//! again. Throws `std::runtime_error` when
//! CUPTI cannot be had (not installed, or a profiler holds its one subscriber).
class api_counter {
public:
    static long total(const std::map<std::string, long>& calls) { return api_calls::total(calls); }

    template <class Work>
    api_calls count(Work&& work) {
        const detail::cupti_entry_points& e = detail::cupti_entry_points::get();
        if (!e.missing.empty()) throw std::runtime_error("capscope::step_meter::api_counter: " + e.missing);
        calls_ = {};
        depth_ = 0;
        thread_ = std::this_thread::get_id(); // the work's own calls: another thread's (NCCL's proxy, a watchdog) are not counted
        CUpti_SubscriberHandle subscriber{};
        if (e.subscribe(&subscriber, &api_counter::callback, this) != CUPTI_SUCCESS)
            throw std::runtime_error("capscope::step_meter::api_counter: CUPTI refused a subscriber (it has one already: a profiler, a "
                                     "sanitizer, or the capture doctor of a runner in its last warmup step)");
        struct unsubscribe {
            const detail::cupti_entry_points& e;
            CUpti_SubscriberHandle s;
            ~unsubscribe() { e.unsubscribe(s); }
        } done{e, subscriber};
        if (e.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
            e.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS)
            throw std::runtime_error("capscope::step_meter::api_counter: CUPTI refused the runtime and driver callback domains");
        work();
        return calls_;
    }

private:
    static bool is_launch(const std::string& f) {
        return f.rfind("cudaLaunch", 0) == 0 || f.rfind("cudaGraphLaunch", 0) == 0 || f.rfind("cuLaunch", 0) == 0 ||
               f.rfind("cuGraphLaunch", 0) == 0;
    }
    static void CUPTIAPI callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
        auto& c = *static_cast<api_counter*>(self);
        if (std::this_thread::get_id() != c.thread_) return;
        const auto* info = static_cast<const CUpti_CallbackData*>(data);
        const bool enter = info->callbackSite == CUPTI_API_ENTER;
        try { // nothing may be thrown through CUDA's own code
            if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
                if (enter) {
                    ++c.calls_.runtime[info->functionName];
                    if (is_launch(info->functionName)) ++c.calls_.launches;
                }
                c.depth_ += enter ? 1 : -1;
                return;
            }
            if (!enter || c.depth_ > 0) return; // the runtime's own driver calls
            ++c.calls_.driver[info->functionName];
            if (is_launch(info->functionName)) ++c.calls_.launches;
        } catch (...) {
        }
    }
    api_calls calls_;
    int depth_ = 0; //!< runtime calls in progress, on the counted thread
    std::thread::id thread_;
};

} // namespace capscope::step_meter
