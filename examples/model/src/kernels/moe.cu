// MoE: router top-k, slot assignment (drop-and-pad or dropless), permute, combine.

#include "common.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;

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
// One block walks the assignments in tiles of its 1024 threads, in token order, so the assignment
// is deterministic. Within a tile each thread's position among its expert's assignments is the
// expert's running count, plus those in earlier warps of the tile (an exclusive sum over warps
// per expert), plus those in earlier lanes of its warp (a match mask). The counts come first, from
// integer atomics (exact in any order): drop-and-pad needs them for padding rows, dropless for
// its offsets.
constexpr int slot_threads = 1024, slot_warps = slot_threads / 32;
__global__ void __launch_bounds__(slot_threads)
    assign_slots_k(const int* expert, int* counts, int* slot, int* row_owner, int tokens, int k, int experts, int capacity, int* overflow) {
    __shared__ int seen[max_experts];       // assignments per expert so far (pass 2)
    __shared__ int kept[max_experts];       // rows each expert keeps
    __shared__ int offset[max_experts + 1]; // first row of each expert
    __shared__ int before[slot_warps][max_experts];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int assignments = tokens * k;
    for (int e = tid; e < experts; e += slot_threads) seen[e] = 0;
    __syncthreads();
    for (int a = tid; a < assignments; a += slot_threads) atomicAdd(&seen[expert[a]], 1);
    __syncthreads();
    if (tid == 0) {
        offset[0] = 0;
        for (int e = 0; e < experts; ++e) {
            kept[e] = capacity > 0 ? min(seen[e], capacity) : seen[e];
            offset[e + 1] = offset[e] + (capacity > 0 ? capacity : seen[e]);
            if (overflow && seen[e] > capacity) *overflow = 1; // a static dropless capacity: this step must be rerun
        }
    }
    __syncthreads();
    for (int e = tid; e < experts; e += slot_threads) {
        counts[e] = kept[e];
        seen[e] = 0;
    }
    if (capacity > 0) // padding rows
        for (int r = tid; r < experts * capacity; r += slot_threads)
            if (r % capacity >= kept[r / capacity]) row_owner[r] = -1;
    for (int tile = 0; tile < assignments; tile += slot_threads) {
        const int a = tile + tid;
        const int e = a < assignments ? expert[a] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int lane_rank = __popc(same & ((1u << lane) - 1u));
        for (int i = tid; i < slot_warps * experts; i += slot_threads) before[i / experts][i % experts] = 0;
        __syncthreads();
        if (e >= 0 && lane_rank == 0) before[warp][e] = __popc(same);
        __syncthreads();
        if (tid < experts) {
            int run = seen[tid];
            for (int w = 0; w < slot_warps; ++w) {
                const int n = before[w][tid];
                before[w][tid] = run;
                run += n;
            }
            seen[tid] = run;
        }
        __syncthreads();
        if (e >= 0) {
            const int pos = before[warp][e] + lane_rank;
            if (capacity > 0 && pos >= capacity) {
                slot[a] = -1; // dropped
            } else {
                slot[a] = offset[e] + pos;
                row_owner[offset[e] + pos] = a;
            }
        }
        __syncthreads(); // `before` is cleared for the next tile
    }
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

} // namespace

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
                  cudaStream_t s, int* overflow) {
    assign_slots_k<<<1, slot_threads, 0, s>>>(expert, counts, slot, row_owner, tokens, k, experts, capacity, overflow);
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

#define INSTANTIATE(T) \
    template void router_topk<T>(const T*, int*, float*, int, int, int, cudaStream_t); \
    template void router_topk_backward<T>(const int*, const float*, const float*, T*, int, int, int, cudaStream_t); \
    template void permute_rows<T>(const T*, const int*, T*, int, int, int, cudaStream_t); \
    template void permute_rows_backward<T>(const T*, const int*, T*, int, int, int, cudaStream_t); \
    template void combine<T>(const T*, const int*, const float*, const T*, T*, int, int, int, cudaStream_t); \
    template void combine_backward<T>(const T*, const T*, const int*, const int*, const float*, T*, float*, int, int, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
INSTANTIATE(__half)

} // namespace gpt::kernels
