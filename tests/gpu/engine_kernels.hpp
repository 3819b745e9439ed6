#pragma once
// Tiny kernels for the engine's synthetic stages (tests/gpu/test_engine.cpp): integer work, so
// every result is exact. Each launch is checked.

#include <cuda_runtime_api.h>

namespace engine_kernels {
//! *counter += 1: a device-resident step count, advanced by a captured kernel.
void add_one(int* counter, cudaStream_t s);
//! out[i] = *counter + offset
void fill_from(int* out, const int* counter, int offset, int n, cudaStream_t s);
//! out[i] = in[i] * factor
void scale(int* out, const int* in, int factor, int n, cudaStream_t s);
//! The same, with the launch left unchecked (a trainer's own error check follows it).
void scale_unchecked(int* out, const int* in, int factor, int n, cudaStream_t s);
//! Spins about `spin_ns` nanoseconds, then out[i] = in[i]: slow enough that work which does not
//! wait for it reads what was there before.
void slow_copy(int* out, const int* in, int n, unsigned spin_ns, cudaStream_t s);
//! out[i] = a[i] + b[i]
void add(int* out, const int* a, const int* b, int n, cudaStream_t s);
//! log[*length] = id (while it fits), then *length += 1: a device-side record of call order.
void append(int* log, int* length, int capacity, int id, cudaStream_t s);
//! *flag = (*counter % modulus != 0): a condition that fails every modulus-th step.
void flag_unless_multiple(int* flag, const int* counter, int modulus, cudaStream_t s);
//! *remaining = *counter % modulus; *flag = *remaining > 0: a loop of that many passes.
void start_countdown(int* remaining, int* flag, const int* counter, int modulus, cudaStream_t s);
//! One pass: *remaining -= 1, *passes += 1, *flag = *remaining > 0.
void count_down(int* remaining, int* flag, int* passes, cudaStream_t s);
//! *counter += 1; then, when *counter == at, x[0] = +inf: an overflow injected at one step.
void inf_at_count(float* x, int* counter, int at, cudaStream_t s);
//! Spins until the host sets *release (pinned host memory) to nonzero: a stream that hangs, as
//! one waiting in a collective for a rank that never comes, until the test lets it go.
void hang_until(const volatile int* release, cudaStream_t s);
} // namespace engine_kernels
