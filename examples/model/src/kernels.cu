// The model's kernels. Simple on purpose: one thread, warp or block per row or column, float
// accumulation, and reductions in a fixed order (warp butterflies and a fixed shared-memory
// tree, never atomics), so results are bitwise reproducible run to run.

#include "kernels.hpp"

#include <capscope/cuda/error.hpp>

#include <cstdint>

namespace gpt::kernels {
namespace {

constexpr int row_threads = 128;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

unsigned blocks_for(long n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

struct sum_op {
    static constexpr float identity = 0.f;
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
    static constexpr float identity = -INFINITY;
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <class Op> __device__ float warp_reduce(float v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float warp_sum(float v) { return warp_reduce(v, sum_op{}); }

// Fixed-order block reduction; every thread gets the result. blockDim.x is a multiple of 32.
template <class Op> __device__ float block_reduce(float v, Op op) {
    __shared__ float part[32];
    v = warp_reduce(v, op);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : Op::identity;
    if (warp == 0) v = warp_reduce(v, op);
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}
__device__ float block_sum(float v) { return block_reduce(v, sum_op{}); }
__device__ float block_max(float v) { return block_reduce(v, max_op{}); }

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// ---- elementwise ---------------------------------------------------------------------------
template <class T> __global__ void cast_from_float_k(const float* in, T* out, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i < n) out[i] = from_f<T>(in[i]);
}

// ---- RMSNorm -------------------------------------------------------------------------------
constexpr float norm_eps = 1e-5f;

template <class T> __global__ void rms_norm_forward_k(const T* x, const T* g, T* y, float* rstd, int cols) {
    const long row = blockIdx.x;
    const T* xr = x + row * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += to_f(xr[c]) * to_f(xr[c]);
    const float r = rsqrtf(block_sum(ss) / cols + norm_eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = from_f<T>(to_f(xr[c]) * r * to_f(g[c]));
    if (threadIdx.x == 0) rstd[row] = r;
}
template <class T>
__global__ void rms_norm_backward_k(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx,
                                    int cols) {
    const long row = blockIdx.x;
    const long base = row * cols;
    float dot = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dot += to_f(dy[base + c]) * to_f(g[c]) * to_f(x[base + c]);
    dot = block_sum(dot);
    const float r = rstd[row];
    const float k = r * r * r * dot / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = r * to_f(g[c]) * to_f(dy[base + c]) - to_f(x[base + c]) * k;
        if (residual_grad) v += to_f(residual_grad[base + c]);
        dx[base + c] = from_f<T>(v);
    }
}
template <class T> __global__ void rms_norm_weight_grad_k(const T* x, const float* rstd, const T* dy, float* dg, int rows, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.f;
    for (int r = 0; r < rows; ++r) acc += to_f(dy[long(r) * cols + c]) * to_f(x[long(r) * cols + c]) * rstd[r];
    dg[c] = acc;
}

// ---- attention -----------------------------------------------------------------------------
// [B*S, 3H] <-> q, k, v [B, heads, S, dh]: Split scatters the packed QKV into heads; the
// reverse gathers the head-major gradients back into the packed layout.
template <class T, bool Split>
__global__ void qkv_heads_k(T* packed, T* q, T* k, T* v, int batch, int seq, int heads, int dh) {
    const int hidden = heads * dh;
    const long n = long(batch) * seq * 3 * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / (3 * hidden);
    const int c = int(i % (3 * hidden));
    const int which = c / hidden, h = (c % hidden) / dh, d = c % dh;
    const long b = t / seq, s = t % seq;
    T* part = which == 0 ? q : which == 1 ? k : v;
    T& head_elem = part[((b * heads + h) * seq + s) * dh + d];
    if constexpr (Split) head_elem = packed[i];
    else packed[i] = head_elem;
}
template <class T> __global__ void merge_heads_k(const T* ctx, T* out, int batch, int seq, int heads, int dh) {
    const int hidden = heads * dh;
    const long n = long(batch) * seq * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int c = int(i % hidden), h = c / dh, d = c % dh;
    const long b = t / seq, s = t % seq;
    out[i] = ctx[((b * heads + h) * seq + s) * dh + d];
}
template <class T> __global__ void unmerge_heads_k(const T* in, T* ctx, int batch, int seq, int heads, int dh) {
    const int hidden = heads * dh;
    const long n = long(batch) * seq * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int c = int(i % hidden), h = c / dh, d = c % dh;
    const long b = t / seq, s = t % seq;
    ctx[((b * heads + h) * seq + s) * dh + d] = in[i];
}
template <class T>
__global__ void masked_softmax_k(T* scores, float scale, attention_mask mask, const int* lengths, int heads, int seq) {
    const long row = blockIdx.x; // (b*heads + h)*seq + i
    const int i = int(row % seq);
    const int b = int(row / seq) / heads;
    const int valid = mask == attention_mask::causal ? i + 1 : lengths[b];
    T* r = scores + row * seq;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, scale * to_f(r[j]));
    mx = block_max(mx);
    float sum = 0.f;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(scale * to_f(r[j]) - mx);
    sum = block_sum(sum);
    const float inv = 1.f / sum;
    for (int j = threadIdx.x; j < seq; j += blockDim.x)
        r[j] = from_f<T>(j < valid ? expf(scale * to_f(r[j]) - mx) * inv : 0.f);
}
template <class T> __global__ void softmax_backward_k(const T* p, T* dp, float scale, int cols) {
    const long base = long(blockIdx.x) * cols;
    float dot = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dot += to_f(p[base + j]) * to_f(dp[base + j]);
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        dp[base + j] = from_f<T>(scale * to_f(p[base + j]) * (to_f(dp[base + j]) - dot));
}

// ---- GELU (tanh form) ----------------------------------------------------------------------
constexpr float gelu_k0 = 0.7978845608028654f, gelu_k1 = 0.044715f;
template <class T> __global__ void gelu_forward_k(const T* x, T* y, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const float v = to_f(x[i]);
    y[i] = from_f<T>(0.5f * v * (1.f + tanhf(gelu_k0 * (v + gelu_k1 * v * v * v))));
}
template <class T> __global__ void gelu_backward_k(const T* x, const T* dy, T* dx, long n) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const float v = to_f(x[i]);
    const float t = tanhf(gelu_k0 * (v + gelu_k1 * v * v * v));
    const float d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * gelu_k0 * (1.f + 3.f * gelu_k1 * v * v);
    dx[i] = from_f<T>(d * to_f(dy[i]));
}

// ---- embeddings ----------------------------------------------------------------------------
template <class T>
__global__ void embedding_forward_k(const int* tokens, const T* tok, const T* pos, T* out, int batch, int seq, int hidden) {
    const long n = long(batch) * seq * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int h = int(i % hidden), s = int(t % seq);
    out[i] = from_f<T>(to_f(tok[long(tokens[t]) * hidden + h]) + to_f(pos[long(s) * hidden + h]));
}
// One thread per (vocab row, column): sums the matching tokens in token order.
template <class T> __global__ void embedding_backward_k(const int* tokens, const T* dout, float* dtok, int vocab, int rows, int hidden) {
    const long n = long(vocab) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int v = int(i / hidden), h = int(i % hidden);
    float acc = 0.f;
    for (int t = 0; t < rows; ++t)
        if (tokens[t] == v) acc += to_f(dout[long(t) * hidden + h]);
    dtok[i] = acc;
}
template <class T> __global__ void position_grad_k(const T* dout, float* dpos, int max_pos, int batch, int seq, int hidden) {
    const long n = long(max_pos) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int p = int(i / hidden), h = int(i % hidden);
    float acc = 0.f;
    if (p < seq)
        for (int b = 0; b < batch; ++b) acc += to_f(dout[(long(b) * seq + p) * hidden + h]);
    dpos[i] = acc;
}
template <class T> __global__ void add_positions_k(T* x, const T* pos, int batch, int seq, int hidden) {
    const long n = long(batch) * seq * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int h = int(i % hidden), s = int(t % seq);
    x[i] = from_f<T>(to_f(x[i]) + to_f(pos[long(s) * hidden + h]));
}

// ---- cross-entropy -------------------------------------------------------------------------
__global__ void count_valid_k(const int* labels, int rows, float* count) {
    float c = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) c += labels[r] >= 0 ? 1.f : 0.f;
    c = block_sum(c);
    if (threadIdx.x == 0) *count = c;
}
template <class T>
__global__ void cross_entropy_rows_k(const T* logits, const int* labels, const float* count, float* row_loss, T* dlogits, int vocab) {
    const long row = blockIdx.x;
    const T* l = logits + row * vocab;
    T* d = dlogits + row * vocab;
    const int label = labels[row];
    const float inv = *count > 0.f ? 1.f / *count : 0.f;
    if (label < 0) {
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) d[j] = from_f<T>(0.f);
        if (threadIdx.x == 0) row_loss[row] = 0.f;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, to_f(l[j]));
    mx = block_max(mx);
    float sum = 0.f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(to_f(l[j]) - mx);
    sum = block_sum(sum);
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        d[j] = from_f<T>((expf(to_f(l[j]) - mx) / sum - (j == label ? 1.f : 0.f)) * inv);
    if (threadIdx.x == 0) row_loss[row] = (logf(sum) + mx - to_f(l[label])) * inv;
}
__global__ void sum_k(const float* x, int n, float* out) {
    float acc = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}

// ---- MoE -----------------------------------------------------------------------------------
constexpr int max_experts = 64;

template <class T> __global__ void router_topk_k(const T* logits, int* expert, float* gate, int tokens, int experts, int k) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const T* l = logits + long(t) * experts;
    std::uint64_t taken = 0;
    float chosen[max_experts];
    for (int j = 0; j < k; ++j) {
        int best = -1;
        float best_v = -INFINITY;
        for (int e = 0; e < experts; ++e) {
            const float v = to_f(l[e]);
            if (!(taken >> e & 1u) && (best < 0 || v > best_v)) best = e, best_v = v;
        }
        taken |= std::uint64_t{1} << best;
        expert[t * k + j] = best;
        chosen[j] = best_v;
    }
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += expf(chosen[j] - chosen[0]); // chosen[0] is the largest
    for (int j = 0; j < k; ++j) gate[t * k + j] = expf(chosen[j] - chosen[0]) / sum;
}
template <class T>
__global__ void router_topk_backward_k(const int* expert, const float* gate, const float* dgate, T* dlogits, int tokens,
                                       int experts, int k) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    T* d = dlogits + long(t) * experts;
    for (int e = 0; e < experts; ++e) d[e] = from_f<T>(0.f);
    float dot = 0.f;
    for (int j = 0; j < k; ++j) dot += gate[t * k + j] * dgate[t * k + j];
    for (int j = 0; j < k; ++j) d[expert[t * k + j]] = from_f<T>(gate[t * k + j] * (dgate[t * k + j] - dot));
}
// One block, one thread per expert: positions in token order, so assignment is deterministic.
__global__ void assign_slots_k(const int* expert, int* counts, int* slot, int* row_owner, int tokens, int k, int experts, int capacity) {
    __shared__ int offset[max_experts + 1];
    const int e = threadIdx.x;
    const int assignments = tokens * k;
    int n = 0;
    if (e < experts)
        for (int a = 0; a < assignments; ++a) n += expert[a] == e;
    if (e < experts) offset[e + 1] = capacity > 0 ? capacity : n;
    __syncthreads();
    if (e == 0) {
        offset[0] = 0;
        for (int i = 1; i <= experts; ++i) offset[i] += offset[i - 1];
    }
    __syncthreads();
    if (e >= experts) return;
    int pos = 0;
    for (int a = 0; a < assignments; ++a) {
        if (expert[a] != e) continue;
        if (capacity > 0 && pos >= capacity) {
            slot[a] = -1; // dropped
        } else {
            slot[a] = offset[e] + pos;
            row_owner[offset[e] + pos] = a;
        }
        ++pos;
    }
    const int kept = capacity > 0 ? min(pos, capacity) : pos;
    for (int r = kept; r < offset[e + 1] - offset[e]; ++r) row_owner[offset[e] + r] = -1;
    counts[e] = kept;
}
template <class T> __global__ void permute_rows_k(const T* x, const int* row_owner, T* out, int rows, int hidden, int k) {
    const long n = long(rows) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int owner = row_owner[i / hidden];
    out[i] = owner < 0 ? from_f<T>(0.f) : x[long(owner / k) * hidden + i % hidden];
}
template <class T> __global__ void permute_rows_backward_k(const T* dout, const int* slot, T* dx, int tokens, int hidden, int k) {
    const long n = long(tokens) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int h = int(i % hidden);
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
        const int r = slot[t * k + j];
        if (r >= 0) acc += to_f(dout[long(r) * hidden + h]);
    }
    dx[i] = from_f<T>(acc);
}
template <class T>
__global__ void combine_k(const T* expert_out, const int* slot, const float* gate, const T* residual, T* y, int tokens, int hidden, int k) {
    const long n = long(tokens) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int h = int(i % hidden);
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
        const int r = slot[t * k + j];
        if (r >= 0) acc += gate[t * k + j] * to_f(expert_out[long(r) * hidden + h]);
    }
    y[i] = from_f<T>(to_f(residual[i]) + acc);
}
template <class T>
__global__ void combine_backward_rows_k(const T* dy, const int* row_owner, const float* gate, T* dexpert_out, int rows, int hidden, int k) {
    const long n = long(rows) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int owner = row_owner[i / hidden];
    dexpert_out[i] = owner < 0 ? from_f<T>(0.f) : from_f<T>(gate[owner] * to_f(dy[long(owner / k) * hidden + i % hidden]));
}
// One warp per assignment: dgate = <dy[t], expert_out[slot]>.
template <class T> __global__ void combine_backward_gate_k(const T* dy, const T* expert_out, const int* slot, float* dgate, int assignments, int hidden, int k) {
    const int a = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (a >= assignments) return;
    const int r = slot[a];
    float acc = 0.f;
    if (r >= 0)
        for (int h = lane; h < hidden; h += 32) acc += to_f(dy[long(a / k) * hidden + h]) * to_f(expert_out[long(r) * hidden + h]);
    acc = warp_sum(acc);
    if (lane == 0) dgate[a] = acc;
}

// ---- Mamba-style gated recurrence ----------------------------------------------------------
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

// ---- AdamW ---------------------------------------------------------------------------------
__global__ void advance_step_k(int* step) { ++*step; }
template <class T>
__global__ void adamw_k(float* master, T* param, const float* grad, float* m, float* v, long n, const int* step, float lr, float b1,
                        float b2, float eps, float wd) {
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const float bc1 = 1.f - powf(b1, float(*step)), bc2 = 1.f - powf(b2, float(*step));
    const float g = grad[i];
    const float mi = b1 * m[i] + (1.f - b1) * g;
    const float vi = b2 * v[i] + (1.f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float w = master[i] - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * master[i]);
    master[i] = w;
    param[i] = from_f<T>(w);
}

} // namespace

// ---- launchers -------------------------------------------------------------------------------
constexpr int elt_threads = 256;
#define CHECKED(name) CAPSCOPE_CHECK_LAUNCH(name)

template <class T> void cast_from_float(const float* in, T* out, long n, cudaStream_t s) {
    if (n == 0) return;
    cast_from_float_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(in, out, n);
    CHECKED("cast_from_float");
}
template <class T> void rms_norm_forward(const T* x, const T* g, T* y, float* rstd, int rows, int cols, cudaStream_t s) {
    rms_norm_forward_k<<<rows, row_threads, 0, s>>>(x, g, y, rstd, cols);
    CHECKED("rms_norm_forward");
}
template <class T>
void rms_norm_backward(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx, int rows, int cols,
                       cudaStream_t s) {
    rms_norm_backward_k<<<rows, row_threads, 0, s>>>(x, g, rstd, dy, residual_grad, dx, cols);
    CHECKED("rms_norm_backward");
}
template <class T> void rms_norm_weight_grad(const T* x, const float* rstd, const T* dy, float* dg, int rows, int cols, cudaStream_t s) {
    rms_norm_weight_grad_k<<<blocks_for(cols, 64), 64, 0, s>>>(x, rstd, dy, dg, rows, cols);
    CHECKED("rms_norm_weight_grad");
}
template <class T> void split_heads(const T* qkv, T* q, T* k, T* v, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * 3 * heads * dh;
    qkv_heads_k<T, true><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(const_cast<T*>(qkv), q, k, v, batch, seq, heads, dh);
    CHECKED("split_heads");
}
template <class T> void merge_heads(const T* ctx, T* out, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * heads * dh;
    merge_heads_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(ctx, out, batch, seq, heads, dh);
    CHECKED("merge_heads");
}
template <class T> void unmerge_heads(const T* in, T* ctx, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * heads * dh;
    unmerge_heads_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(in, ctx, batch, seq, heads, dh);
    CHECKED("unmerge_heads");
}
template <class T>
void merge_qkv_grads(const T* dq, const T* dk, const T* dv, T* dqkv, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * 3 * heads * dh;
    qkv_heads_k<T, false><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(dqkv, const_cast<T*>(dq), const_cast<T*>(dk),
                                                                            const_cast<T*>(dv), batch, seq, heads, dh);
    CHECKED("merge_qkv_grads");
}
template <class T>
void masked_softmax(T* scores, float scale, attention_mask mask, const int* lengths, int batch, int heads, int seq, cudaStream_t s) {
    masked_softmax_k<<<unsigned(long(batch) * heads * seq), row_threads, 0, s>>>(scores, scale, mask, lengths, heads, seq);
    CHECKED("masked_softmax");
}
template <class T> void softmax_backward(const T* p, T* dp, float scale, int rows, int cols, cudaStream_t s) {
    softmax_backward_k<<<rows, row_threads, 0, s>>>(p, dp, scale, cols);
    CHECKED("softmax_backward");
}
template <class T> void gelu_forward(const T* x, T* y, long n, cudaStream_t s) {
    gelu_forward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, y, n);
    CHECKED("gelu_forward");
}
template <class T> void gelu_backward(const T* x, const T* dy, T* dx, long n, cudaStream_t s) {
    gelu_backward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, dy, dx, n);
    CHECKED("gelu_backward");
}
template <class T>
void embedding_forward(const int* tokens, const T* tok, const T* pos, T* out, int batch, int seq, int hidden, cudaStream_t s) {
    const long n = long(batch) * seq * hidden;
    embedding_forward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(tokens, tok, pos, out, batch, seq, hidden);
    CHECKED("embedding_forward");
}
template <class T>
void embedding_backward(const int* tokens, const T* dout, float* dtok, float* dpos, int vocab, int max_pos, int batch, int seq,
                        int hidden, cudaStream_t s) {
    embedding_backward_k<<<blocks_for(long(vocab) * hidden, elt_threads), elt_threads, 0, s>>>(tokens, dout, dtok, vocab,
                                                                                              batch * seq, hidden);
    CHECKED("embedding_backward");
    position_grad(dout, dpos, max_pos, batch, seq, hidden, s);
}
template <class T> void add_positions(T* x, const T* pos, int batch, int seq, int hidden, cudaStream_t s) {
    const long n = long(batch) * seq * hidden;
    add_positions_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, pos, batch, seq, hidden);
    CHECKED("add_positions");
}
template <class T> void position_grad(const T* dout, float* dpos, int max_pos, int batch, int seq, int hidden, cudaStream_t s) {
    position_grad_k<<<blocks_for(long(max_pos) * hidden, elt_threads), elt_threads, 0, s>>>(dout, dpos, max_pos, batch, seq, hidden);
    CHECKED("position_grad");
}
template <class T>
void cross_entropy(const T* logits, const int* labels, float* row_loss, float* loss, float* valid_count, T* dlogits, int rows,
                   int vocab, cudaStream_t s) {
    count_valid_k<<<1, 256, 0, s>>>(labels, rows, valid_count);
    CHECKED("count_valid");
    cross_entropy_rows_k<<<rows, row_threads, 0, s>>>(logits, labels, valid_count, row_loss, dlogits, vocab);
    CHECKED("cross_entropy_rows");
    sum_k<<<1, 256, 0, s>>>(row_loss, rows, loss);
    CHECKED("sum");
}
template <class T> void router_topk(const T* logits, int* expert, float* gate, int tokens, int experts, int k, cudaStream_t s) {
    router_topk_k<<<blocks_for(tokens, 128), 128, 0, s>>>(logits, expert, gate, tokens, experts, k);
    CHECKED("router_topk");
}
template <class T>
void router_topk_backward(const int* expert, const float* gate, const float* dgate, T* dlogits, int tokens, int experts, int k,
                          cudaStream_t s) {
    router_topk_backward_k<<<blocks_for(tokens, 128), 128, 0, s>>>(expert, gate, dgate, dlogits, tokens, experts, k);
    CHECKED("router_topk_backward");
}
void assign_slots(const int* expert, int* counts, int* slot, int* row_owner, int tokens, int k, int experts, int capacity,
                  cudaStream_t s) {
    assign_slots_k<<<1, ((experts + 31) / 32) * 32, 0, s>>>(expert, counts, slot, row_owner, tokens, k, experts, capacity);
    CHECKED("assign_slots");
}
template <class T> void permute_rows(const T* x, const int* row_owner, T* out, int rows, int hidden, int k, cudaStream_t s) {
    const long n = long(rows) * hidden;
    if (n == 0) return;
    permute_rows_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(x, row_owner, out, rows, hidden, k);
    CHECKED("permute_rows");
}
template <class T> void permute_rows_backward(const T* dout, const int* slot, T* dx, int tokens, int hidden, int k, cudaStream_t s) {
    const long n = long(tokens) * hidden;
    permute_rows_backward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(dout, slot, dx, tokens, hidden, k);
    CHECKED("permute_rows_backward");
}
template <class T>
void combine(const T* expert_out, const int* slot, const float* gate, const T* residual, T* y, int tokens, int hidden, int k,
             cudaStream_t s) {
    const long n = long(tokens) * hidden;
    combine_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(expert_out, slot, gate, residual, y, tokens, hidden, k);
    CHECKED("combine");
}
template <class T>
void combine_backward(const T* dy, const T* expert_out, const int* slot, const int* row_owner, const float* gate, T* dexpert_out,
                      float* dgate, int tokens, int rows, int hidden, int k, cudaStream_t s) {
    const long n = long(rows) * hidden;
    if (n > 0) {
        combine_backward_rows_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(dy, row_owner, gate, dexpert_out, rows, hidden, k);
        CHECKED("combine_backward_rows");
    }
    const long threads = long(tokens) * k * 32;
    combine_backward_gate_k<<<blocks_for(threads, 256), 256, 0, s>>>(dy, expert_out, slot, dgate, tokens * k, hidden, k);
    CHECKED("combine_backward_gate");
}
template <class T> void gated_scan_forward(const T* proj, float* h, T* y, int batch, int seq, int inner, cudaStream_t s) {
    gated_scan_forward_k<<<blocks_for(long(batch) * inner, 128), 128, 0, s>>>(proj, h, y, batch, seq, inner);
    CHECKED("gated_scan_forward");
}
template <class T>
void gated_scan_backward(const T* proj, const float* h, const T* dy, T* dproj, int batch, int seq, int inner, cudaStream_t s) {
    gated_scan_backward_k<<<blocks_for(long(batch) * inner, 128), 128, 0, s>>>(proj, h, dy, dproj, batch, seq, inner);
    CHECKED("gated_scan_backward");
}
template <class T>
void adamw(float* master, T* param, const float* grad, float* m, float* v, long n, int* step, float lr, float beta1, float beta2,
           float eps, float weight_decay, cudaStream_t s) {
    advance_step_k<<<1, 1, 0, s>>>(step);
    CHECKED("advance_step");
    adamw_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(master, param, grad, m, v, n, step, lr, beta1, beta2, eps, weight_decay);
    CHECKED("adamw");
}

#define GPT_INSTANTIATE(T)                                                                                                  \
    template void cast_from_float<T>(const float*, T*, long, cudaStream_t);                                                \
    template void rms_norm_forward<T>(const T*, const T*, T*, float*, int, int, cudaStream_t);                             \
    template void rms_norm_backward<T>(const T*, const T*, const float*, const T*, const T*, T*, int, int, cudaStream_t);  \
    template void rms_norm_weight_grad<T>(const T*, const float*, const T*, float*, int, int, cudaStream_t);               \
    template void split_heads<T>(const T*, T*, T*, T*, int, int, int, int, cudaStream_t);                                  \
    template void merge_heads<T>(const T*, T*, int, int, int, int, cudaStream_t);                                          \
    template void unmerge_heads<T>(const T*, T*, int, int, int, int, cudaStream_t);                                        \
    template void merge_qkv_grads<T>(const T*, const T*, const T*, T*, int, int, int, int, cudaStream_t);                  \
    template void masked_softmax<T>(T*, float, attention_mask, const int*, int, int, int, cudaStream_t);                   \
    template void softmax_backward<T>(const T*, T*, float, int, int, cudaStream_t);                                        \
    template void gelu_forward<T>(const T*, T*, long, cudaStream_t);                                                       \
    template void gelu_backward<T>(const T*, const T*, T*, long, cudaStream_t);                                            \
    template void embedding_forward<T>(const int*, const T*, const T*, T*, int, int, int, cudaStream_t);                   \
    template void embedding_backward<T>(const int*, const T*, float*, float*, int, int, int, int, int, cudaStream_t);      \
    template void add_positions<T>(T*, const T*, int, int, int, cudaStream_t);                                             \
    template void position_grad<T>(const T*, float*, int, int, int, int, cudaStream_t);                                    \
    template void cross_entropy<T>(const T*, const int*, float*, float*, float*, T*, int, int, cudaStream_t);              \
    template void router_topk<T>(const T*, int*, float*, int, int, int, cudaStream_t);                                     \
    template void router_topk_backward<T>(const int*, const float*, const float*, T*, int, int, int, cudaStream_t);        \
    template void permute_rows<T>(const T*, const int*, T*, int, int, int, cudaStream_t);                                  \
    template void permute_rows_backward<T>(const T*, const int*, T*, int, int, int, cudaStream_t);                         \
    template void combine<T>(const T*, const int*, const float*, const T*, T*, int, int, int, cudaStream_t);               \
    template void combine_backward<T>(const T*, const T*, const int*, const int*, const float*, T*, float*, int, int, int, \
                                      int, cudaStream_t);                                                                  \
    template void gated_scan_forward<T>(const T*, float*, T*, int, int, int, cudaStream_t);                                \
    template void gated_scan_backward<T>(const T*, const float*, const T*, T*, int, int, int, cudaStream_t);               \
    template void adamw<T>(float*, T*, const float*, float*, float*, long, int*, float, float, float, float, float, cudaStream_t);

GPT_INSTANTIATE(float)
GPT_INSTANTIATE(__nv_bfloat16)

} // namespace gpt::kernels
