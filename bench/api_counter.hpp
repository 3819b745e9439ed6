#pragma once
// Counting CUDA API calls (capscope::step_meter::api_counter, CUPTI's callback API), and the check of
// CUPTI calls the bench's own timeline (kernel_timeline.hpp) makes.

#include <capscope/cuda/error.hpp>

#include <capscope/run/step_meter.hpp>

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

// The library's (capscope/run/step_meter.hpp), which loads CUPTI at run time.
using capscope::step_meter::api_calls;
using capscope::step_meter::api_counter;

} // namespace bench
