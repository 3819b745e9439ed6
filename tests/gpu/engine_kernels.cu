#include "engine_kernels.hpp"

#include <capscope/cuda/error.hpp>

namespace engine_kernels {
namespace {
__global__ void add_one_kernel(int* c) { *c += 1; }
__global__ void append_kernel(int* log, int* length, int capacity, int id) {
    if (*length < capacity) log[*length] = id;
    *length += 1;
}
__global__ void fill_kernel(int* out, const int* counter, int offset, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = *counter + offset;
}
__global__ void scale_kernel(int* out, const int* in, int factor, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor;
}
__global__ void slow_copy_kernel(int* out, const int* in, int n, unsigned spin_ns) {
    for (unsigned waited = 0; waited < spin_ns; waited += 1000) __nanosleep(1000);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
__global__ void add_kernel(int* out, const int* a, const int* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
__global__ void flag_unless_multiple_kernel(int* flag, const int* counter, int modulus) { *flag = *counter % modulus != 0; }
__global__ void start_countdown_kernel(int* remaining, int* flag, const int* counter, int modulus) {
    *remaining = *counter % modulus;
    *flag = *remaining > 0;
}
__global__ void count_down_kernel(int* remaining, int* flag, int* passes) {
    *remaining -= 1;
    *passes += 1;
    *flag = *remaining > 0;
}
__global__ void inf_at_count_kernel(float* x, int* counter, int at) {
    *counter += 1;
    if (*counter == at) x[0] = __int_as_float(0x7f800000); // +inf
}
__global__ void hang_until_kernel(const volatile int* release) {
    while (*release == 0) __nanosleep(10000);
}
int blocks(int n) { return (n + 255) / 256; }
} // namespace

void add_one(int* counter, cudaStream_t s) {
    add_one_kernel<<<1, 1, 0, s>>>(counter);
    CAPSCOPE_CHECK_LAUNCH("add_one_kernel");
}
void fill_from(int* out, const int* counter, int offset, int n, cudaStream_t s) {
    fill_kernel<<<blocks(n), 256, 0, s>>>(out, counter, offset, n);
    CAPSCOPE_CHECK_LAUNCH("fill_kernel");
}
void scale(int* out, const int* in, int factor, int n, cudaStream_t s) {
    scale_kernel<<<blocks(n), 256, 0, s>>>(out, in, factor, n);
    CAPSCOPE_CHECK_LAUNCH("scale_kernel");
}
void scale_unchecked(int* out, const int* in, int factor, int n, cudaStream_t s) {
    scale_kernel<<<blocks(n), 256, 0, s>>>(out, in, factor, n); // the caller checks, as a trainer of its own does
}
void slow_copy(int* out, const int* in, int n, unsigned spin_ns, cudaStream_t s) {
    slow_copy_kernel<<<blocks(n), 256, 0, s>>>(out, in, n, spin_ns);
    CAPSCOPE_CHECK_LAUNCH("slow_copy_kernel");
}
void add(int* out, const int* a, const int* b, int n, cudaStream_t s) {
    add_kernel<<<blocks(n), 256, 0, s>>>(out, a, b, n);
    CAPSCOPE_CHECK_LAUNCH("add_kernel");
}
void append(int* log, int* length, int capacity, int id, cudaStream_t s) {
    append_kernel<<<1, 1, 0, s>>>(log, length, capacity, id);
    CAPSCOPE_CHECK_LAUNCH("append_kernel");
}
void flag_unless_multiple(int* flag, const int* counter, int modulus, cudaStream_t s) {
    flag_unless_multiple_kernel<<<1, 1, 0, s>>>(flag, counter, modulus);
    CAPSCOPE_CHECK_LAUNCH("flag_unless_multiple_kernel");
}
void start_countdown(int* remaining, int* flag, const int* counter, int modulus, cudaStream_t s) {
    start_countdown_kernel<<<1, 1, 0, s>>>(remaining, flag, counter, modulus);
    CAPSCOPE_CHECK_LAUNCH("start_countdown_kernel");
}
void inf_at_count(float* x, int* counter, int at, cudaStream_t s) {
    inf_at_count_kernel<<<1, 1, 0, s>>>(x, counter, at);
    CAPSCOPE_CHECK_LAUNCH("inf_at_count_kernel");
}
void count_down(int* remaining, int* flag, int* passes, cudaStream_t s) {
    count_down_kernel<<<1, 1, 0, s>>>(remaining, flag, passes);
    CAPSCOPE_CHECK_LAUNCH("count_down_kernel");
}
void hang_until(const volatile int* release, cudaStream_t s) {
    hang_until_kernel<<<1, 1, 0, s>>>(release);
    CAPSCOPE_CHECK_LAUNCH("hang_until_kernel");
}
} // namespace engine_kernels
