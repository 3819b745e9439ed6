#pragma once
// A toy pipeline stage, y = x * w + 1/4 elementwise, in fp32 without fused multiply-adds, so that
// a CPU reference computes the same bits: tutorial 15's trainer, the pipeline probe
// (tests/mpi/pipeline_p2p_probe.cpp) and bench/pipeline share it.
#include <cuda_runtime.h>

namespace pipeline_kernels {

void forward(const float* x, const float* w, float* y, int n, cudaStream_t s);
//! dw += dy * x; dx = dy * w (where dx is given).
void backward(const float* dy, const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s);
//! The last stage: dy = x * w + 1/4 (the loss is half the output's square), then as `backward`.
void last_backward(const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s);
//! *total += the sum of y^2 / 2 over y[0, n), in double, in one fixed order (one block), so that
//! a replayed graph adds the same bits as the eager step: the last stage's loss.
void add_half_square(const float* y, double* total, int n, cudaStream_t s);
//! w -= lr * dw; dw = 0.
void sgd(float* w, float* dw, float lr, int n, cudaStream_t s);
//! The first stage's data loader inside a graph: dst = pool[*counter], then ++*counter (the
//! microbatch is read on the device, so one captured load serves every microbatch).
void load_next(const float* pool, int* counter, float* dst, int n, cudaStream_t s);
//! A pass's weight for a bench: `iterations` dependent multiply-adds per element of `scratch`
//! (the probe's math does not read it).
void burn(float* scratch, int n, int iterations, cudaStream_t s);
//! Holds the stream for about `ns` nanoseconds (a rank made late on purpose).
void spin(long long ns, cudaStream_t s);

} // namespace pipeline_kernels
