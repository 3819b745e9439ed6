// The Mamba-style gated linear recurrence, forward and reverse scan.

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

// The recurrence is affine in the state, so a stretch of positions maps an incoming state x to
// A x + B (forward) and a stretch walked in reverse maps an incoming carry the same way. Each
// block takes 32 channels (threadIdx.x: coalesced rows) of one sequence and splits the positions
// into `scan_chunks` stretches (threadIdx.y): every thread first composes its stretch's map, then
// folds the maps of the stretches before it (in a fixed order: deterministic), then walks its
// stretch again from the true state, writing. 32 threads per channel instead of one walking the
// whole sequence: the dependent chain is 2 seq / 32 + 31 steps long, not seq.
constexpr int scan_lanes = 32, scan_chunks = 32;

struct stretch {
    int begin, end;
    __device__ stretch(int seq) {
        const int len = (seq + scan_chunks - 1) / scan_chunks;
        begin = min(seq, int(threadIdx.y) * len);
        end = min(seq, begin + len);
    }
};

template <class T>
__global__ void __launch_bounds__(scan_lanes* scan_chunks) gated_scan_forward_k(const T* proj, float* h, T* y, int seq, int inner) {
    __shared__ float map_a[scan_chunks][scan_lanes + 1], map_b[scan_chunks][scan_lanes + 1];
    const int d = blockIdx.x * scan_lanes + threadIdx.x, b = blockIdx.y, x = threadIdx.x, c = threadIdx.y;
    const bool live = d < inner;
    const stretch part(seq);
    const long base = long(b) * seq;
    float A = 1.f, B = 0.f; // this stretch: state_out = A state_in + B
    if (live)
        for (int s = part.begin; s < part.end; ++s) {
            const T* p = proj + (base + s) * 3 * inner;
            const float u = to_f(p[d]), a = sigmoid(to_f(p[2 * inner + d]));
            B = a * B + (1.f - a) * u;
            A *= a;
        }
    map_a[c][x] = A;
    map_b[c][x] = B;
    __syncthreads();
    float state = 0.f;
    for (int j = 0; j < c; ++j) state = map_a[j][x] * state + map_b[j][x];
    if (!live) return;
    for (int s = part.begin; s < part.end; ++s) {
        const long t = base + s;
        const T* p = proj + t * 3 * inner;
        const float u = to_f(p[d]), z = to_f(p[inner + d]), a = sigmoid(to_f(p[2 * inner + d]));
        state = a * state + (1.f - a) * u;
        h[t * inner + d] = state;
        y[t * inner + d] = from_f<T>(state * z * sigmoid(z));
    }
}

// Backward, positions in reverse: dh_t = dy_t z_t silu'(..) + carry, carry <- dh_t a_t. A stretch
// maps the carry coming in from the later positions to the carry it passes on: P carry + Q.
template <class T>
__global__ void __launch_bounds__(scan_lanes* scan_chunks)
    gated_scan_backward_k(const T* proj, const float* h, const T* dy, T* dproj, int seq, int inner) {
    __shared__ float map_p[scan_chunks][scan_lanes + 1], map_q[scan_chunks][scan_lanes + 1];
    const int d = blockIdx.x * scan_lanes + threadIdx.x, b = blockIdx.y, x = threadIdx.x, c = threadIdx.y;
    const bool live = d < inner;
    const stretch part(seq);
    const long base = long(b) * seq;
    float P = 1.f, Q = 0.f;
    if (live)
        for (int s = part.end - 1; s >= part.begin; --s) {
            const long t = base + s;
            const T* p = proj + t * 3 * inner;
            const float z = to_f(p[inner + d]), a = sigmoid(to_f(p[2 * inner + d]));
            const float g = to_f(dy[t * inner + d]);
            Q = (g * z * sigmoid(z) + Q) * a;
            P *= a;
        }
    map_p[c][x] = P;
    map_q[c][x] = Q;
    __syncthreads();
    float carry = 0.f; // dL/dh_t through h_{t+1}, from the stretches after this one
    for (int j = scan_chunks - 1; j > c; --j) carry = map_p[j][x] * carry + map_q[j][x];
    if (!live) return;
    for (int s = part.end - 1; s >= part.begin; --s) {
        const long t = base + s;
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

dim3 scan_block() { return dim3(scan_lanes, scan_chunks); }
dim3 scan_grid(int batch, int inner) { return dim3(blocks_for(inner, scan_lanes), unsigned(batch)); }

} // namespace

template <class T> void gated_scan_forward(const T* proj, float* h, T* y, int batch, int seq, int inner, cudaStream_t s) {
    if (batch == 0 || seq == 0 || inner == 0) return;
    gated_scan_forward_k<<<scan_grid(batch, inner), scan_block(), 0, s>>>(proj, h, y, seq, inner);
    CHECKED("gated_scan_forward");
}
template <class T>
void gated_scan_backward(const T* proj, const float* h, const T* dy, T* dproj, int batch, int seq, int inner, cudaStream_t s) {
    if (batch == 0 || seq == 0 || inner == 0) return;
    gated_scan_backward_k<<<scan_grid(batch, inner), scan_block(), 0, s>>>(proj, h, dy, dproj, seq, inner);
    CHECKED("gated_scan_backward");
}

#define INSTANTIATE(T) \
    template void gated_scan_forward<T>(const T*, float*, T*, int, int, int, cudaStream_t); \
    template void gated_scan_backward<T>(const T*, const float*, const T*, T*, int, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
INSTANTIATE(__half)

} // namespace gpt::kernels
