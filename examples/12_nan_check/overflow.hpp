#pragma once
// Tutorial 12's own kernel (overflow.cu, nvcc): *steps += 1; at the step `at`, x[0] = +inf.

#include <cuda_runtime_api.h>

void overflow_at(float* x, int* steps, int at, cudaStream_t s);
