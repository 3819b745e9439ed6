#pragma once
// The pipeline probe's stage: y = x * w + 1/4, elementwise, in fp32 without fused multiply-adds,
// so that the CPU reference computes the same bits.
#include <cuda_runtime.h>

namespace pipeline_kernels {

void forward(const float* x, const float* w, float* y, int n, cudaStream_t s);
//! dw += dy * x; dx = dy * w (where dx is given).
void backward(const float* dy, const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s);
//! The last stage: dy = x * w + 1/4 (the loss is half the output's square), then as `backward`.
void last_backward(const float* x, const float* w, float* dw, float* dx, int n, cudaStream_t s);
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
