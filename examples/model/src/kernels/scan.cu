// The Mamba-style gated linear recurrence, forward and reverse scan.

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

template <class T> __global__ void gated_scan_forward_k(const T* proj, float* h, T* y, int batch, int seq, int inner) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch * inner) return;
    const int b = i / inner, d = i % inner;
    float state = 0.f;
    for (int s = 0; s < seq; ++s) {
        const long t = long(b) * seq + s;
        const T* p = proj + t * 3 * inner;
        const float u = to_f(p[d]), z = to_f(p[inner + d]), a = sigmoid(to_f(p[2 * inner + d]));
        state = a * state + (1.f - a) * u;
        h[t * inner + d] = state;
        y[t * inner + d] = from_f<T>(state * z * sigmoid(z));
    }
}
template <class T>
__global__ void gated_scan_backward_k(const T* proj, const float* h, const T* dy, T* dproj, int batch, int seq, int inner) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch * inner) return;
    const int b = i / inner, d = i % inner;
    float carry = 0.f; // dL/dh_t through h_{t+1}
    for (int s = seq - 1; s >= 0; --s) {
        const long t = long(b) * seq + s;
        const T* p = proj + t * 3 * inner;
        T* dp = dproj + t * 3 * inner;
        const float u = to_f(p[d]), z = to_f(p[inner + d]), a = sigmoid(to_f(p[2 * inner + d]));
        const float ht = h[t * inner + d];
        const float hprev = s > 0 ? h[(t - 1) * inner + d] : 0.f;
        const float g = to_f(dy[t * inner + d]);
        const float sz = sigmoid(z);
        const float dh = g * z * sz + carry;
        dp[inner + d] = from_f<T>(g * ht * sz * (1.f + z * (1.f - sz)));
        dp[d] = from_f<T>(dh * (1.f - a));
        dp[2 * inner + d] = from_f<T>(dh * (hprev - u) * a * (1.f - a));
        carry = dh * a;
    }
}

} // namespace

template <class T> void gated_scan_forward(const T* proj, float* h, T* y, int batch, int seq, int inner, cudaStream_t s) {
    gated_scan_forward_k<<<blocks_for(long(batch) * inner, 128), 128, 0, s>>>(proj, h, y, batch, seq, inner);
    CHECKED("gated_scan_forward");
}
template <class T>
void gated_scan_backward(const T* proj, const float* h, const T* dy, T* dproj, int batch, int seq, int inner, cudaStream_t s) {
    gated_scan_backward_k<<<blocks_for(long(batch) * inner, 128), 128, 0, s>>>(proj, h, dy, dproj, batch, seq, inner);
    CHECKED("gated_scan_backward");
}

#define INSTANTIATE(T) \
    template void gated_scan_forward<T>(const T*, float*, T*, int, int, int, cudaStream_t); \
    template void gated_scan_backward<T>(const T*, const float*, const T*, T*, int, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)

} // namespace gpt::kernels
