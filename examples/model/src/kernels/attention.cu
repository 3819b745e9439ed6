// Attention: head layout changes and the masked softmax (GEMMs are cuBLAS, in blocks.cu).

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

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
// [B*S, H] <-> [B, heads, S, dh]: Merge gathers the attention context back into token rows; the
// reverse splits a token-row gradient into heads.
template <class T, bool Merge> __global__ void heads_k(T* rows, T* ctx, int batch, int seq, int heads, int dh) {
    const int hidden = heads * dh;
    const long n = long(batch) * seq * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const long t = i / hidden;
    const int c = int(i % hidden), h = c / dh, d = c % dh;
    const long b = t / seq, s = t % seq;
    T& head_elem = ctx[((b * heads + h) * seq + s) * dh + d];
    if constexpr (Merge) rows[i] = head_elem;
    else head_elem = rows[i];
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

} // namespace

template <class T> void split_heads(const T* qkv, T* q, T* k, T* v, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * 3 * heads * dh;
    qkv_heads_k<T, true><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(const_cast<T*>(qkv), q, k, v, batch, seq, heads, dh);
    CHECKED("split_heads");
}
template <class T> void merge_heads(const T* ctx, T* out, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * heads * dh;
    heads_k<T, true><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(out, const_cast<T*>(ctx), batch, seq, heads, dh);
    CHECKED("merge_heads");
}
template <class T> void unmerge_heads(const T* in, T* ctx, int batch, int seq, int heads, int dh, cudaStream_t s) {
    const long n = long(batch) * seq * heads * dh;
    heads_k<T, false><<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(const_cast<T*>(in), ctx, batch, seq, heads, dh);
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

#define INSTANTIATE(T) \
    template void split_heads<T>(const T*, T*, T*, T*, int, int, int, int, cudaStream_t); \
    template void merge_heads<T>(const T*, T*, int, int, int, int, cudaStream_t); \
    template void unmerge_heads<T>(const T*, T*, int, int, int, int, cudaStream_t); \
    template void merge_qkv_grads<T>(const T*, const T*, const T*, T*, int, int, int, int, cudaStream_t); \
    template void masked_softmax<T>(T*, float, attention_mask, const int*, int, int, int, cudaStream_t); \
    template void softmax_backward<T>(const T*, T*, float, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)

} // namespace gpt::kernels
