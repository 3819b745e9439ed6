// Tutorial 12's own kernel: an overflow injected at one step, counted on the device, so that a
// replayed whole-step graph overflows at the same step as an eager run.
#include "overflow.hpp"

#include <capscope/cuda/error.hpp>

namespace {
__global__ void overflow_at_kernel(float* x, int* steps, int at) {
    *steps += 1;
    if (*steps == at) x[0] = __int_as_float(0x7f800000); // +inf
}
} // namespace

void overflow_at(float* x, int* steps, int at, cudaStream_t s) {
    overflow_at_kernel<<<1, 1, 0, s>>>(x, steps, at);
    CAPSCOPE_CHECK_LAUNCH("overflow_at_kernel");
}
