// The model's ends: token and position embeddings, and the cross-entropy loss.

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

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
// dtok[v, h] += sum over tokens t == v of dout[t, h], in token order (embedding_backward_k below).
constexpr int embedding_threads = 256;
// Token v's rows of dout, summed by one thread per column in ascending row order (the same
// order, and so the same bits, on every run). A block takes one token id and 256 columns: for each
// chunk of 256 rows it finds the rows holding v by a ballot and a prefix over the warps, in row
// order, and adds only those; the rows are read once per token that holds them.
template <class T> __global__ void embedding_backward_k(const int* tokens, const T* dout, float* dtok, int rows, int hidden) {
    static_assert(embedding_threads % 32 == 0);
    constexpr int warps = embedding_threads / 32;
    __shared__ int match[embedding_threads];
    __shared__ int warp_matches[warps];
    const int v = blockIdx.x, h = blockIdx.y * embedding_threads + threadIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc = 0.f;
    for (int t0 = 0; t0 < rows; t0 += embedding_threads) { // every thread takes every pass: the ballot needs the whole warp
        const int t = t0 + int(threadIdx.x);
        const bool mine = t < rows && tokens[t] == v;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        __syncthreads(); // every thread is done with the chunk before
        if (lane == 0) warp_matches[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, found = 0;
#pragma unroll
        for (int w = 0; w < warps; ++w) {
            before += w < warp ? warp_matches[w] : 0;
            found += warp_matches[w];
        }
        if (mine) match[before + __popc(ballot & ((1u << lane) - 1u))] = t;
        __syncthreads();
        if (h < hidden)
            for (int k = 0; k < found; ++k) acc += to_f(dout[long(match[k]) * hidden + h]);
    }
    if (h < hidden) dtok[long(v) * hidden + h] += acc; // accumulates over microbatches
}
template <class T> __global__ void position_grad_k(const T* dout, float* dpos, int max_pos, int batch, int seq, int hidden) {
    const long n = long(max_pos) * hidden;
    long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int p = int(i / hidden), h = int(i % hidden);
    float acc = 0.f;
    if (p < seq)
        for (int b = 0; b < batch; ++b) acc += to_f(dout[(long(b) * seq + p) * hidden + h]);
    dpos[i] += acc;
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
__global__ void cross_entropy_rows_k(const T* logits, const int* labels, const float* count, float* row_loss, T* dlogits, int vocab,
                                     float grad_scale, const float* loss_scale) {
    const long row = blockIdx.x;
    const T* l = logits + row * vocab;
    T* d = dlogits + row * vocab;
    const int label = labels[row];
    const float inv = *count > 0.f ? 1.f / *count : 0.f;
    const float scale = loss_scale ? *loss_scale : 1.f; // times 1 is exact: no scale, the same bits
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
        d[j] = from_f<T>((expf(to_f(l[j]) - mx) / sum - (j == label ? 1.f : 0.f)) * inv * grad_scale * scale);
    if (threadIdx.x == 0) row_loss[row] = (logf(sum) + mx - to_f(l[label])) * inv;
}
__global__ void sum_k(const float* x, int n, float* out) {
    float acc = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}

} // namespace

template <class T>
void embedding_forward(const int* tokens, const T* tok, const T* pos, T* out, int batch, int seq, int hidden, cudaStream_t s) {
    const long n = long(batch) * seq * hidden;
    embedding_forward_k<<<blocks_for(n, elt_threads), elt_threads, 0, s>>>(tokens, tok, pos, out, batch, seq, hidden);
    CHECKED("embedding_forward");
}
template <class T>
void embedding_backward(const int* tokens, const T* dout, float* dtok, float* dpos, int vocab, int max_pos, int batch, int seq,
                        int hidden, cudaStream_t s) {
    embedding_backward_k<<<dim3(vocab, blocks_for(hidden, embedding_threads)), embedding_threads, 0, s>>>(tokens, dout, dtok, batch * seq,
                                                                                                         hidden);
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
                   int vocab, float grad_scale, cudaStream_t s, const float* loss_scale) {
    count_valid_k<<<1, 256, 0, s>>>(labels, rows, valid_count);
    CHECKED("count_valid");
    cross_entropy_rows_k<<<rows, row_threads, 0, s>>>(logits, labels, valid_count, row_loss, dlogits, vocab, grad_scale, loss_scale);
    CHECKED("cross_entropy_rows");
    sum_k<<<1, 256, 0, s>>>(row_loss, rows, loss);
    CHECKED("sum");
}

#define INSTANTIATE(T) \
    template void embedding_forward<T>(const int*, const T*, const T*, T*, int, int, int, cudaStream_t); \
    template void embedding_backward<T>(const int*, const T*, float*, float*, int, int, int, int, int, cudaStream_t); \
    template void add_positions<T>(T*, const T*, int, int, int, cudaStream_t); \
    template void position_grad<T>(const T*, float*, int, int, int, int, cudaStream_t); \
    template void cross_entropy<T>(const T*, const int*, float*, float*, float*, T*, int, int, float, cudaStream_t, const float*);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
INSTANTIATE(__half)

} // namespace gpt::kernels
