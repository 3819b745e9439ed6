// doctest's main for the GPU suite, compiled once with g++: with no usable GPU it reports the
// suite skipped (exit 77, which Meson counts as SKIP), never passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "breakage.hpp"

#include <capscope/cuda/device.hpp>

#include <cstdio>

int main(int argc, char** argv) {
    if (capscope::cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: GPU tests skipped");
        return capscope::cuda::skip_exit_code;
    }
    breakage::install_from_environment();
    doctest::Context context(argc, argv);
    return context.run();
}
