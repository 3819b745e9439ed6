// Fused attention, forward: O = softmax(scale * Q K^T + mask) V in one pass over the keys, tile
// by tile, with the online softmax (a running row maximum and sum), so no S x S score matrix is
// ever written. Each query row's log-sum-exp is kept for the backward.
//
// bf16 or fp16 on sm_80 and later: 4 warps per 64 query rows, each warp 16 rows, S and P V on tensor
// cores (mma.sync), fp32 accumulation, P rounded to the input type for P V (as FlashAttention-2 does).
// fp32 (and 16-bit without tensor cores): one thread per query row in fp32, the same tiling.

#include "flash_attention.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;
using namespace detail::flash;

template <class E, int DH>
__global__ void __launch_bounds__(threads) forward_mma(const E* qkv, E* out, float* lse, problem pb) {
    extern __shared__ __align__(16) unsigned char smem[];
    // Q, then a ring of K and V tiles: the next ones load while this one is used.
    const smem_tile<DH> qs{reinterpret_cast<std::uint16_t*>(smem)};
    const tile_ring<DH> ring{qs.data + tile * qs.pitch};
    const int qt = gridDim.x - 1 - blockIdx.x; // the longest causal rows start first
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const E* q = head_rows(qkv, stride, pb, b, h);
    const E *k = q + H, *v = q + 2 * H;
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int q0 = qt * tile, limit = key_limit(pb, b), end = key_end(pb, limit, q0);
    const int rows[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    // Key tile k0 into a stage, as one group of copies (empty past the end, so every loop step
    // commits one group and waits for the same count).
    auto load_keys = [&](int k0, int stage) {
        if (k0 < end) {
            load_tile_async(ring.at(stage, 0), k, stride, k0, pb.seq, pb.dh);
            load_tile_async(ring.at(stage, 1), v, stride, k0, pb.seq, pb.dh);
        }
        commit_tiles();
    };
    if (end > 0) load_tile_async(qs, q, stride, q0, pb.seq, pb.dh); // in the first key tile's group
#pragma unroll
    for (int stage = 0; stage + 1 < ring.stages; ++stage) load_keys(stage * tile, stage);
    frag_a qa[DH / 16];

    float o[DH / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int k0 = 0, stage = 0; k0 < end; k0 += tile, stage = ring.next(stage)) {
        const smem_tile<DH> ks = ring.at(stage, 0), vs = ring.at(stage, 1);
        wait_tiles<ring.stages - 2>(); // this tile has landed, and every warp is done with the one before
        if (k0 == 0) {
#pragma unroll
            for (int kk = 0; kk < DH / 16; ++kk) qa[kk] = load_a(qs, 16 * warp, 16 * kk);
        }
        load_keys(k0 + (ring.stages - 1) * tile, ring.before(stage));
        float s[tile / 8][4] = {};
        rows_times_tile_t<E, DH>(s, qa, ks);
        const bool edge = k0 + tile > limit || (pb.mask == attention_mask::causal && k0 + tile > q0 + 1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < tile / 8; ++j)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    const int key = k0 + 8 * j + 2 * t + (e & 1);
                    if (edge && !visible(pb, limit, rows[half], key)) s[j][e] = -INFINITY;
                    mx = fmaxf(mx, s[j][e]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // The maximum of the raw scores, then one FMA per score: exp2(scale_log2 * s - max).
            const float m_new = fmaxf(m[half], mx * pb.scale_log2);
            const float base = m_new == -INFINITY ? 0.f : m_new; // a row with nothing visible yet stays at zero
            const float rescale = fast_exp2(m[half] - base);
            m[half] = m_new;
            l[half] *= rescale;
#pragma unroll
            for (int n = 0; n < DH / 8; ++n) o[n][2 * half] *= rescale, o[n][2 * half + 1] *= rescale;
#pragma unroll
            for (int j = 0; j < tile / 8; ++j)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    s[j][e] = fast_exp2(fmaf(s[j][e], pb.scale_log2, -base));
                    l[half] += s[j][e];
                }
        }
        acc_times_tile<E, DH>(o, s, vs);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        const float inv = l[half] > 0.f ? 1.f / l[half] : 0.f; // no visible key: the output is zero
#pragma unroll
        for (int n = 0; n < DH / 8; ++n) o[n][2 * half] *= inv, o[n][2 * half + 1] *= inv;
        if (t == 0 && rows[half] < pb.seq)
            lse[long(bh) * pb.seq + rows[half]] = l[half] > 0.f ? m[half] + log2f(l[half]) : INFINITY;
    }
    store_rows<E, DH>(head_rows(out, H, pb, b, h), H, q0 + 16 * warp, pb.seq, pb.dh, o, 1.f);
}

// One thread per query row, fp32 throughout: the reference path of the same algorithm.
template <class T, int DH>
__global__ void __launch_bounds__(tile) forward_scalar(const T* qkv, T* out, float* lse, problem pb) {
    __shared__ float ks[scalar_keys][DH], vs[scalar_keys][DH];
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const T* q = head_rows(qkv, stride, pb, b, h);
    const T *k = q + H, *v = q + 2 * H;
    const int q0 = blockIdx.x * tile, i = q0 + threadIdx.x, limit = key_limit(pb, b), end = key_end(pb, limit, q0);
    float qi[DH], o[DH];
#pragma unroll
    for (int d = 0; d < DH; ++d) qi[d] = i < pb.seq && d < pb.dh ? to_f(q[long(i) * stride + d]) : 0.f, o[d] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int k0 = 0; k0 < end; k0 += scalar_keys) {
        __syncthreads();
        load_rows_f(ks, k, stride, k0, pb.seq, pb.dh);
        load_rows_f(vs, v, stride, k0, pb.seq, pb.dh);
        __syncthreads();
        for (int jj = 0; jj < scalar_keys; ++jj) {
            if (i >= pb.seq || !visible(pb, limit, i, k0 + jj)) continue;
            float dot = 0.f;
#pragma unroll
            for (int d = 0; d < DH; ++d) dot += qi[d] * ks[jj][d];
            const float s = dot * pb.scale_log2, m_new = fmaxf(m, s);
            const float rescale = exp2f(m - m_new), p = exp2f(s - m_new);
            l = l * rescale + p;
#pragma unroll
            for (int d = 0; d < DH; ++d) o[d] = o[d] * rescale + p * vs[jj][d];
            m = m_new;
        }
    }
    if (i >= pb.seq) return;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* orow = head_rows(out, H, pb, b, h) + long(i) * H;
#pragma unroll
    for (int d = 0; d < DH; ++d)
        if (d < pb.dh) orow[d] = from_f<T>(o[d] * inv);
    lse[long(bh) * pb.seq + i] = l > 0.f ? m + log2f(l) : INFINITY;
}

template <class E, int DH> void launch_forward_mma(const E* qkv, E* out, float* lse, const problem& pb, cudaStream_t s) {
    constexpr int bytes = smem_tile_bytes<DH> + ring_bytes<DH>;
    allow_dynamic_smem<forward_mma<E, DH>>(bytes);
    forward_mma<E, DH><<<dim3(blocks_for(pb.seq, tile), pb.batch * pb.heads), threads, bytes, s>>>(qkv, out, lse, pb);
}
template <class T, int DH> void launch_forward_scalar(const T* qkv, T* out, float* lse, const problem& pb, cudaStream_t s) {
    forward_scalar<T, DH><<<dim3(blocks_for(pb.seq, tile), pb.batch * pb.heads), tile, 0, s>>>(qkv, out, lse, pb);
}

} // namespace

template <class T>
void flash_attention_forward(const T* qkv, T* out, float* lse, attention_mask mask, const int* lengths, int batch, int seq, int heads,
                             int head_dim, cudaStream_t s) {
    const problem pb = make_problem(mask, lengths, batch, seq, heads, head_dim);
    if (uses_tensor_cores<T>(head_dim)) {
        if constexpr (sixteen_bit<T>) {
            with_head_dim(head_dim, [&]<int DH>() { launch_forward_mma<T, DH>(qkv, out, lse, pb, s); });
        }
    } else {
        with_head_dim(head_dim, [&]<int DH>() { launch_forward_scalar<T, DH>(qkv, out, lse, pb, s); });
    }
    CHECKED("flash_attention_forward");
}

template void flash_attention_forward<float>(const float*, float*, float*, attention_mask, const int*, int, int, int, int, cudaStream_t);
template void flash_attention_forward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, float*, attention_mask, const int*, int, int,
                                                     int, int, cudaStream_t);
template void flash_attention_forward<__half>(const __half*, __half*, float*, attention_mask, const int*, int, int,
                                                     int, int, cudaStream_t);

} // namespace gpt::kernels
