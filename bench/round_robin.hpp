#pragma once
// What the benchmarks share: the device or a skip, medians, and timing variants round-robin in one process (so drift
// hits them alike): per step, the device time between CUDA events and the host time of the
// enqueueing call.

#include <capscope/cuda/device.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>

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

template <class T> double median(std::vector<T> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : (v.size() % 2 ? double(v[v.size() / 2]) : 0.5 * (double(v[v.size() / 2 - 1]) + double(v[v.size() / 2])));
}

//! `rounds` rounds; in each, `steps_per_round` steps of every variant in turn. A variant has
//! `step(cudaStream_t)` and the vectors `device_ms` and `host_us` (floats) it appends to.
template <class Variant> void time_round_robin(std::vector<Variant>& variants, int rounds, int steps_per_round, cudaStream_t s) {
    std::vector<capscope::cuda::event> marks;
    for (int i = 0; i <= steps_per_round; ++i) marks.push_back(capscope::cuda::event::timing());
    for (int round = 0; round < rounds; ++round)
        for (auto& x : variants) {
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
                x.device_ms.push_back(capscope::cuda::event::elapsed_ms(marks[std::size_t(i)], marks[std::size_t(i) + 1]));
        }
}

} // namespace bench
