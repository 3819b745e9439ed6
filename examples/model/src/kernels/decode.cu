// Greedy decoding: the keys and values kept per position (the KV cache), attention from one new
// token to the cache, one step of the gated scan from a kept state, and the greedy choice with the
// loop's bookkeeping on the device, so a whole generation can run as one graph (a WHILE node).
// Every position the decode reads (the current one, the step) lives in device memory: a replay
// reads the value the previous pass wrote.

#include "common.cuh"

#include <stdexcept>
#include <string>

namespace gpt::kernels {
namespace {
using namespace detail;

constexpr int decode_threads = 128;

// qkv rows b*prompt + s, [q | k | v] each `hidden` wide -> cache[b][s] (k and v apart).
template <class T>
__global__ void kv_cache_fill_k(const T* qkv, T* cache_k, T* cache_v, int rows, int prompt, int hidden, int seq_cap) {
    const long n = long(rows) * prompt * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int c = int(i % hidden), b = int(t / prompt), s = int(t % prompt);
    const long to = (long(b) * seq_cap + s) * hidden + c;
    cache_k[to] = qkv[t * 3 * hidden + hidden + c];
    cache_v[to] = qkv[t * 3 * hidden + 2 * hidden + c];
}
template <class T>
__global__ void kv_cache_append_k(const T* qkv, T* cache_k, T* cache_v, const int* position, int rows, int hidden, int seq_cap) {
    const long n = long(rows) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n || *position >= seq_cap) return; // a step past the last changes nothing
    const int b = int(i / hidden), c = int(i % hidden);
    const long to = (long(b) * seq_cap + *position) * hidden + c;
    cache_k[to] = qkv[long(b) * 3 * hidden + hidden + c];
    cache_v[to] = qkv[long(b) * 3 * hidden + 2 * hidden + c];
}
// One block per (sequence, head): scores of the query against keys 0..position, softmax, the
// weighted sum of the values. Each key's score is one thread's sum over the head width, and the
// reductions run in a fixed order: the result does not depend on timing.
template <class T>
__global__ void __launch_bounds__(decode_threads)
    decode_attention_k(const T* qkv, const T* cache_k, const T* cache_v, const int* position, T* out, int heads, int dh, int seq_cap,
                       float scale) {
    extern __shared__ float shared[];
    float* score = shared;        // [seq_cap]
    float* q = shared + seq_cap;  // [dh]
    const int b = blockIdx.x / heads, head = blockIdx.x % heads, H = heads * dh;
    if (*position >= seq_cap) return; // a step past the last (every thread alike)
    const int keys = *position + 1;
    for (int d = threadIdx.x; d < dh; d += blockDim.x) q[d] = to_f(qkv[long(b) * 3 * H + long(head) * dh + d]);
    __syncthreads();
    const T* k0 = cache_k + long(b) * seq_cap * H + long(head) * dh;
    const T* v0 = cache_v + long(b) * seq_cap * H + long(head) * dh;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) {
        float s = 0.f;
        for (int d = 0; d < dh; ++d) s += q[d] * to_f(k0[long(j) * H + d]);
        score[j] = s * scale;
        mx = fmaxf(mx, score[j]);
    }
    mx = block_max(mx);
    float sum = 0.f;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) sum += score[j] = expf(score[j] - mx);
    sum = block_sum(sum); // its barriers also order the score writes before the reads below
    for (int d = threadIdx.x; d < dh; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < keys; ++j) acc += score[j] * to_f(v0[long(j) * H + d]);
        out[long(b) * H + long(head) * dh + d] = from_f<T>(acc / sum);
    }
}
// The token at the device position for each sequence: tok[last[b]] + pos[position].
template <class T>
__global__ void decode_embedding_k(const int* last, const int* position, const T* tok, const T* pos, T* out, int rows, int hidden, int positions) {
    const long n = long(rows) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n || *position >= positions) return;
    const int b = int(i / hidden), h = int(i % hidden);
    out[i] = from_f<T>(to_f(tok[long(last[b]) * hidden + h]) + to_f(pos[long(*position) * hidden + h]));
}
// The scan's state after the prompt: h of position prompt - 1 of each sequence.
__global__ void scan_state_fill_k(const float* h, float* state, int rows, int prompt, int inner) {
    const long n = long(rows) * inner;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int b = int(i / inner), d = int(i % inner);
    state[i] = h[(long(b) * prompt + prompt - 1) * inner + d];
}
// One position of h_t = a h_{t-1} + (1 - a) u, y = h silu(z), from the kept state.
template <class T> __global__ void scan_step_k(const T* proj, float* state, T* y, int rows, int inner) {
    const long n = long(rows) * inner;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int b = int(i / inner), d = int(i % inner);
    const T* p = proj + long(b) * 3 * inner;
    const float u = to_f(p[d]), z = to_f(p[inner + d]), a = sigmoid(to_f(p[2 * inner + d]));
    const float h = a * state[i] + (1.f - a) * u;
    state[i] = h;
    y[i] = from_f<T>(h * z * sigmoid(z));
}

__global__ void decode_begin_k(decode_state st, int rows) {
    for (int b = threadIdx.x; b < rows; b += blockDim.x) st.done[b] = 0;
    if (threadIdx.x == 0) *st.step = 0;
}
// The largest logit of row b (the first index among equals), one block per sequence; then the
// sequence's next token: that index, or the end token again once the sequence has ended.
template <class T>
__global__ void __launch_bounds__(decode_threads)
    greedy_pick_k(const T* logits, int row_stride, int row_offset, int vocab, decode_state st, int end_token, int max_new) {
    __shared__ float best_v[decode_threads / 32];
    __shared__ int best_i[decode_threads / 32];
    const int b = blockIdx.x;
    const T* l = logits + (long(b) * row_stride + row_offset) * vocab;
    float v = -INFINITY;
    int idx = vocab;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float x = to_f(l[j]);
        if (x == x && (idx == vocab || x > v)) v = x, idx = j; // j rises: a tie keeps the first; NaN never wins
    }
    auto better = [vocab](float ov, int oi, float v, int idx) { return oi < vocab && (idx == vocab || ov > v || (ov == v && oi < idx)); };
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (better(ov, oi, v, idx)) v = ov, idx = oi;
    }
    if ((threadIdx.x & 31) == 0) best_v[threadIdx.x >> 5] = v, best_i[threadIdx.x >> 5] = idx;
    __syncthreads();
    if (threadIdx.x != 0 || *st.step >= max_new) return; // a step past the last changes nothing
    for (int w = 1; w < decode_threads / 32; ++w)
        if (better(best_v[w], best_i[w], v, idx)) v = best_v[w], idx = best_i[w];
    if (idx >= vocab) idx = 0; // only NaNs: token 0
    const int step = *st.step;
    const bool ended = st.done[b] != 0;
    const int token = ended ? end_token : idx;
    st.generated[long(b) * max_new + step] = token;
    st.last[b] = token;
    if (!ended && token == end_token) st.done[b] = 1;
}
// After a pick: one token more; the loop goes on while a real sequence has not ended and fewer
// than max_new tokens are out. When it stops early (every real sequence has ended), the tokens it
// will not make are the end token, as a sequence's tokens after its end are.
__global__ void decode_advance_k(decode_state st, const int* valid, int rows, int prompt, int max_new, int end_token) {
    __shared__ int step, more;
    if (*st.step >= max_new) { // a step past the last changes nothing (every thread reads the same value)
        if (threadIdx.x == 0) *st.flag = 0;
        return;
    }
    __syncthreads(); // every thread has read *st.step before thread 0 moves it
    if (threadIdx.x == 0) {
        step = *st.step + 1;
        *st.step = step;
        *st.position = prompt - 1 + step;
        const int real = min(*valid, rows);
        int open = 0;
        for (int b = 0; b < real; ++b) open |= st.done[b] == 0;
        more = open && step < max_new;
        *st.flag = more;
    }
    __syncthreads();
    if (more) return;
    for (long i = threadIdx.x; i < long(rows) * max_new; i += blockDim.x)
        if (int(i % max_new) >= step) st.generated[i] = end_token;
}

} // namespace

template <class T> void kv_cache_fill(const T* qkv, T* cache_k, T* cache_v, int rows, int prompt, int hidden, int seq_cap, cudaStream_t s) {
    const long n = long(rows) * prompt * hidden;
    kv_cache_fill_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(qkv, cache_k, cache_v, rows, prompt, hidden, seq_cap);
    CHECKED("kv_cache_fill");
}
template <class T>
void kv_cache_append(const T* qkv, T* cache_k, T* cache_v, const int* position, int rows, int hidden, int seq_cap, cudaStream_t s) {
    kv_cache_append_k<<<blocks_for(long(rows) * hidden, elt_threads), elt_threads, 0, s>>>(qkv, cache_k, cache_v, position, rows, hidden,
                                                                                           seq_cap);
    CHECKED("kv_cache_append");
}
template <class T>
void decode_attention(const T* qkv, const T* cache_k, const T* cache_v, const int* position, T* out, int rows, int heads, int dh,
                      int seq_cap, cudaStream_t s) {
    const std::size_t shared = decode_attention_shared_bytes(seq_cap, dh);
    if (shared > decode_attention_shared_limit)
        throw std::invalid_argument("decode_attention: " + std::to_string(seq_cap) + " positions need " + std::to_string(shared) +
                                    " bytes of shared memory for the scores, past " + std::to_string(decode_attention_shared_limit) +
                                    "; use a shorter seq_len");
    decode_attention_k<<<unsigned(rows * heads), decode_threads, shared, s>>>(qkv, cache_k, cache_v, position, out, heads, dh, seq_cap,
                                                                            1.f / sqrtf(float(dh)));
    CHECKED("decode_attention");
}
template <class T>
void decode_embedding(const int* last, const int* position, const T* tok, const T* pos, T* out, int rows, int hidden, int positions,
                      cudaStream_t s) {
    decode_embedding_k<<<blocks_for(long(rows) * hidden, elt_threads), elt_threads, 0, s>>>(last, position, tok, pos, out, rows, hidden,
                                                                                            positions);
    CHECKED("decode_embedding");
}
void scan_state_fill(const float* h, float* state, int rows, int prompt, int inner, cudaStream_t s) {
    scan_state_fill_k<<<blocks_for(long(rows) * inner, elt_threads), elt_threads, 0, s>>>(h, state, rows, prompt, inner);
    CHECKED("scan_state_fill");
}
template <class T> void scan_step(const T* proj, float* state, T* y, int rows, int inner, cudaStream_t s) {
    scan_step_k<<<blocks_for(long(rows) * inner, elt_threads), elt_threads, 0, s>>>(proj, state, y, rows, inner);
    CHECKED("scan_step");
}
void decode_begin(const decode_state& st, int rows, cudaStream_t s) {
    decode_begin_k<<<1, decode_threads, 0, s>>>(st, rows);
    CHECKED("decode_begin");
}
template <class T>
void greedy_pick(const T* logits, int row_stride, int row_offset, int rows, int vocab, const decode_state& st, int end_token, int max_new,
                 cudaStream_t s) {
    greedy_pick_k<<<unsigned(rows), decode_threads, 0, s>>>(logits, row_stride, row_offset, vocab, st, end_token, max_new);
    CHECKED("greedy_pick");
}
void decode_advance(const decode_state& st, const int* valid, int rows, int prompt, int max_new, int end_token, cudaStream_t s) {
    decode_advance_k<<<1, decode_threads, 0, s>>>(st, valid, rows, prompt, max_new, end_token);
    CHECKED("decode_advance");
}

#define INSTANTIATE(T) \
    template void kv_cache_fill<T>(const T*, T*, T*, int, int, int, int, cudaStream_t); \
    template void kv_cache_append<T>(const T*, T*, T*, const int*, int, int, int, cudaStream_t); \
    template void decode_attention<T>(const T*, const T*, const T*, const int*, T*, int, int, int, int, cudaStream_t); \
    template void decode_embedding<T>(const int*, const int*, const T*, const T*, T*, int, int, int, cudaStream_t); \
    template void scan_step<T>(const T*, float*, T*, int, int, cudaStream_t); \
    template void greedy_pick<T>(const T*, int, int, int, int, const decode_state&, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
INSTANTIATE(__half)

} // namespace gpt::kernels
