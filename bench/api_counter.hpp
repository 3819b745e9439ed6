#pragma once
// Counts CUDA API calls with CUPTI's callback API while counting is on: every entry into a runtime
// function, by name; every driver function called directly (cuBLAS launches its kernels through
// the driver), by name; and the launches among them (kernels and graphs, through either API).
// Driver calls made inside a runtime call are the runtime's own work and are not counted again.
// Counting is a separate pass from timing (the callback costs).

#include <capscope/cuda/error.hpp>

#include <cupti.h>

#include <map>
#include <string>

namespace bench {

inline void check_cupti(CUptiResult r, const char* call, const char* file, int line) {
    if (r == CUPTI_SUCCESS) return;
    const char* text = nullptr;
    cuptiGetResultString(r, &text);
    throw std::runtime_error(std::string("CUPTI error: ") + call + " failed: " + (text ? text : "?") + " at " + file + ":" +
                             std::to_string(line));
}
#define BENCH_CUPTI(...) ::bench::check_cupti((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

//! What a piece of work called.
struct api_calls {
    std::map<std::string, long> runtime; //!< runtime API calls, by function
    std::map<std::string, long> driver;  //!< driver API calls made directly (not inside a runtime call), by function
    long launches = 0;                   //!< kernel and graph launches, through either API

    //! " cudaGraphLaunch ×28 ...; driver: cuKernelGetName ×2": every function and its count.
    std::string by_function() const {
        std::string s;
        for (const auto& [name, n] : runtime) s += " " + name + " ×" + std::to_string(n);
        if (!driver.empty()) s += "; driver:";
        for (const auto& [name, n] : driver) s += " " + name + " ×" + std::to_string(n);
        return s;
    }
};

class api_counter {
public:
    //! Counts the API calls `work()` makes.
    template <class Work>
    api_calls count(Work&& work) {
        calls_ = {};
        depth_ = 0;
        CUpti_SubscriberHandle subscriber{};
        BENCH_CUPTI(cuptiSubscribe(&subscriber, &api_counter::callback, this));
        BENCH_CUPTI(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API));
        BENCH_CUPTI(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API));
        try {
            work();
        } catch (...) {
            cuptiUnsubscribe(subscriber);
            throw;
        }
        BENCH_CUPTI(cuptiUnsubscribe(subscriber));
        return calls_;
    }
    static long total(const std::map<std::string, long>& calls) {
        long n = 0;
        for (const auto& [name, k] : calls) n += k;
        return n;
    }

private:
    static bool is_launch(const std::string& f) {
        return f.rfind("cudaLaunch", 0) == 0 || f.rfind("cudaGraphLaunch", 0) == 0 || f.rfind("cuLaunch", 0) == 0 ||
               f.rfind("cuGraphLaunch", 0) == 0;
    }
    static void CUPTIAPI callback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
        auto& c = *static_cast<api_counter*>(self);
        const auto* info = static_cast<const CUpti_CallbackData*>(data);
        const bool enter = info->callbackSite == CUPTI_API_ENTER;
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
    }
    api_calls calls_;
    int depth_ = 0; //!< runtime calls in progress
};

} // namespace bench
