#pragma once
// Counts CUDA runtime API calls with CUPTI's callback API: every entry into a runtime function
// while counting is on, by name. Counting is a separate pass from timing (the callback costs).

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

class api_counter {
public:
    //! Counts the runtime API calls `work()` makes.
    template <class Work>
    std::map<std::string, long> count(Work&& work) {
        calls_.clear();
        CUpti_SubscriberHandle subscriber{};
        BENCH_CUPTI(cuptiSubscribe(&subscriber, &api_counter::callback, this));
        BENCH_CUPTI(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API));
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
    static void CUPTIAPI callback(void* self, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
        const auto* info = static_cast<const CUpti_CallbackData*>(data);
        if (info->callbackSite == CUPTI_API_ENTER) ++static_cast<api_counter*>(self)->calls_[info->functionName];
    }
    std::map<std::string, long> calls_;
};

} // namespace bench
