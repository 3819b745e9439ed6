#pragma once
// What the benchmarks share: the device or a skip, medians, and timing variants round-robin in one process (so drift
// hits them alike): per step, the device time between CUDA events and the host time of the
// enqueueing call.

#include <capscope/cuda/device.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/run/step_meter.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

//! The name of the GPU a bench runs on. Without a usable one, says so and exits with the skip
//! code (77), as every bench does.
inline std::string device_or_skip() {
    if (capscope::cuda::usable_device_count() == 0) {
        std::printf("no CUDA device: skipped\n");
        std::exit(capscope::cuda::skip_exit_code);
    }
    cudaDeviceProp prop{};
    CAPSCOPE_CHECK(cudaGetDeviceProperties(&prop, 0));
    return prop.name;
}

//! Device memory in use on the current device (bytes), as cudaMemGetInfo says.
inline std::size_t device_used() {
    std::size_t free = 0, total = 0;
    CAPSCOPE_CHECK(cudaMemGetInfo(&free, &total));
    return total - free;
}

// The library's (capscope/run/step_meter.hpp): what a trainer of its own times its step with too.
using capscope::step_meter::median;
using capscope::step_meter::time_round_robin;

} // namespace bench
