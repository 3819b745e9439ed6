// Fused attention, backward, recomputing P = exp2(scale_log2 * Q K^T - lse) tile by tile:
//   D   = rowsum(dO * O)                      (one small kernel)
//   dV  = P^T dO,  dK = scale * dS^T Q        (one block per 64 keys, looping over query tiles)
//   dQ  = scale * dS K                        (one block per 64 queries, looping over key tiles)
// with dS = P * (dO V^T - D). Every gradient element is summed by one thread, in one order, in
// registers: dK and dV over query tiles, dQ over key tiles. No atomics, so the result is the same
// bit for bit on every run; the price is computing Q K^T and dO V^T twice (once per kernel).

#include "flash_attention.cuh"

namespace gpt::kernels {
namespace {
using namespace detail;
using namespace detail::flash;

// D[bh, i] = sum_d dO[i, d] O[i, d]; one warp per row.
template <class T> __global__ void rowdot_k(const T* out, const T* dout, float* rowdot, problem pb) {
    const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (row >= long(pb.batch) * pb.heads * pb.seq) return;
    const int i = int(row % pb.seq), bh = int(row / pb.seq), b = bh / pb.heads, h = bh % pb.heads;
    const long H = pb.hidden(), at = long(i) * H;
    const T *o = head_rows(out, H, pb, b, h) + at, *d_o = head_rows(dout, H, pb, b, h) + at;
    float sum = 0.f;
    for (int d = threadIdx.x & 31; d < pb.dh; d += 32) sum += to_f(o[d]) * to_f(d_o[d]);
    sum = warp_sum(sum);
    if ((threadIdx.x & 31) == 0) rowdot[row] = sum;
}

template <class E, int DH>
__global__ void __launch_bounds__(threads)
    key_grads_mma(const E* qkv, const E* dout, const float* lse, const float* rowdot, E* dqkv,
                  problem pb) {
    extern __shared__ __align__(16) unsigned char smem[];
    // K, V, then a ring of Q and dO tiles, then their rows' lse and D per stage: the next query
    // tiles load while this one is used.
    const smem_tile<DH> ks{reinterpret_cast<std::uint16_t*>(smem)};
    const smem_tile<DH> vs{ks.data + tile * ks.pitch};
    const tile_ring<DH> ring{ks.data + 2 * tile * ks.pitch};
    float* const row_stats = reinterpret_cast<float*>(smem + 2 * smem_tile_bytes<DH> + ring_bytes<DH>); // [stage][lse | D][tile]
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const E* q = head_rows(qkv, stride, pb, b, h);
    const E* d_o = head_rows(dout, H, pb, b, h);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int k0 = blockIdx.x * tile, limit = key_limit(pb, b);
    const int keys[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};

    float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
    if (k0 < limit) {
        const int q_first = first_query(pb, k0);
        // Query tile q0's rows into a stage, as one group: Q and dO by cp.async, lse and D by
        // plain stores (+inf and 0 past the end, so P = 0 there), all visible after the wait for
        // it. Empty past the last tile, so every loop step commits one group.
        auto load_queries = [&](int q0, int stage) {
            if (q0 < pb.seq) {
                load_tile_async(ring.at(stage, 0), q, stride, q0, pb.seq, pb.dh);
                load_tile_async(ring.at(stage, 1), d_o, H, q0, pb.seq, pb.dh);
                if (threadIdx.x < tile) {
                    const int i = q0 + threadIdx.x;
                    float* st = row_stats + stage * 2 * tile;
                    st[threadIdx.x] = i < pb.seq ? lse[long(bh) * pb.seq + i] : INFINITY;
                    st[tile + threadIdx.x] = i < pb.seq ? rowdot[long(bh) * pb.seq + i] : 0.f;
                }
            }
            commit_tiles();
        };
        load_tile_async(ks, q + H, stride, k0, pb.seq, pb.dh); // in the first query tile's group
        load_tile_async(vs, q + 2 * H, stride, k0, pb.seq, pb.dh);
#pragma unroll
        for (int stage = 0; stage + 1 < ring.stages; ++stage) load_queries(q_first + stage * tile, stage);
        // The warp's 16 keys as A fragments: held in registers where they fit beside the
        // accumulators (head_dim <= 64), else read from shared memory for each query tile.
        constexpr bool hold_keys = DH <= 64;
        frag_a ka[DH / 16], va[DH / 16];
        auto load_key_fragments = [&] {
#pragma unroll
            for (int kk = 0; kk < DH / 16; ++kk) ka[kk] = load_a(ks, 16 * warp, 16 * kk), va[kk] = load_a(vs, 16 * warp, 16 * kk);
        };
        for (int q0 = q_first, stage = 0; q0 < pb.seq; q0 += tile, stage = ring.next(stage)) {
            const smem_tile<DH> qs = ring.at(stage, 0), dos = ring.at(stage, 1);
            const float* lse_s = row_stats + stage * 2 * tile;
            const float* d_s = lse_s + tile;
            wait_tiles<ring.stages - 2>(); // this tile has landed, and every warp is done with the one before
            if (!hold_keys || q0 == q_first) load_key_fragments();
            load_queries(q0 + (ring.stages - 1) * tile, ring.before(stage));
            float p[tile / 8][4] = {}, ds[tile / 8][4] = {}; // transposed: rows are keys, columns queries
            rows_times_tile_t<E, DH>(p, ka, qs);
            rows_times_tile_t<E, DH>(ds, va, dos);
            const bool edge = k0 + tile > limit || (pb.mask == attention_mask::causal && q0 < k0 + tile - 1);
#pragma unroll
            for (int j = 0; j < tile / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * j + 2 * t + (e & 1);
                    const bool seen = !edge || visible(pb, limit, q0 + col, keys[e >> 1]);
                    p[j][e] = seen ? fast_exp2(fmaf(p[j][e], pb.scale_log2, -lse_s[col])) : 0.f;
                    ds[j][e] = p[j][e] * (ds[j][e] - d_s[col]);
                }
            acc_times_tile<E, DH>(dv, p, dos);
            acc_times_tile<E, DH>(dk, ds, qs);
        }
    }
    const float scale = pb.scale_log2 / log2e;
    store_rows<E, DH>(head_rows(dqkv, stride, pb, b, h) + H, stride, k0 + 16 * warp, pb.seq, pb.dh, dk, scale);
    store_rows<E, DH>(head_rows(dqkv, stride, pb, b, h) + 2 * H, stride, k0 + 16 * warp, pb.seq, pb.dh, dv, 1.f);
}

template <class E, int DH>
__global__ void __launch_bounds__(threads)
    query_grads_mma(const E* qkv, const E* dout, const float* lse, const float* rowdot, E* dqkv,
                    problem pb) {
    extern __shared__ __align__(16) unsigned char smem[];
    // Q, dO, then a ring of K and V tiles: the next ones load while this one is used.
    const smem_tile<DH> qs{reinterpret_cast<std::uint16_t*>(smem)};
    const smem_tile<DH> dos{qs.data + tile * qs.pitch};
    const tile_ring<DH> ring{qs.data + 2 * tile * qs.pitch};
    const int qt = gridDim.x - 1 - blockIdx.x;
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const E* q = head_rows(qkv, stride, pb, b, h);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const int q0 = qt * tile, limit = key_limit(pb, b), end = key_end(pb, limit, q0);
    const int rows[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    float row_lse[2], row_d[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const bool real = rows[half] < pb.seq;
        row_lse[half] = real ? lse[long(bh) * pb.seq + rows[half]] : INFINITY;
        row_d[half] = real ? rowdot[long(bh) * pb.seq + rows[half]] : 0.f;
    }
    // Key tile k0 into a stage, as one group (empty past the end).
    auto load_keys = [&](int k0, int stage) {
        if (k0 < end) {
            load_tile_async(ring.at(stage, 0), q + H, stride, k0, pb.seq, pb.dh);
            load_tile_async(ring.at(stage, 1), q + 2 * H, stride, k0, pb.seq, pb.dh);
        }
        commit_tiles();
    };
    if (end > 0) { // in the first key tile's group
        load_tile_async(qs, q, stride, q0, pb.seq, pb.dh);
        load_tile_async(dos, head_rows(dout, H, pb, b, h), H, q0, pb.seq, pb.dh);
    }
#pragma unroll
    for (int stage = 0; stage + 1 < ring.stages; ++stage) load_keys(stage * tile, stage);
    frag_a qa[DH / 16], doa[DH / 16];

    float dq[DH / 8][4] = {};
    for (int k0 = 0, stage = 0; k0 < end; k0 += tile, stage = ring.next(stage)) {
        const smem_tile<DH> ks = ring.at(stage, 0), vs = ring.at(stage, 1);
        wait_tiles<ring.stages - 2>(); // this tile has landed, and every warp is done with the one before
        if (k0 == 0) {
#pragma unroll
            for (int kk = 0; kk < DH / 16; ++kk) qa[kk] = load_a(qs, 16 * warp, 16 * kk), doa[kk] = load_a(dos, 16 * warp, 16 * kk);
        }
        load_keys(k0 + (ring.stages - 1) * tile, ring.before(stage));
        float p[tile / 8][4] = {}, ds[tile / 8][4] = {};
        rows_times_tile_t<E, DH>(p, qa, ks);
        rows_times_tile_t<E, DH>(ds, doa, vs);
        const bool edge = k0 + tile > limit || (pb.mask == attention_mask::causal && k0 + tile > q0 + 1);
#pragma unroll
        for (int j = 0; j < tile / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int half = e >> 1;
                const bool seen = !edge || visible(pb, limit, rows[half], k0 + 8 * j + 2 * t + (e & 1));
                p[j][e] = seen ? fast_exp2(fmaf(p[j][e], pb.scale_log2, -row_lse[half])) : 0.f;
                ds[j][e] = p[j][e] * (ds[j][e] - row_d[half]);
            }
        acc_times_tile<E, DH>(dq, ds, ks);
    }
    store_rows<E, DH>(head_rows(dqkv, stride, pb, b, h), stride, q0 + 16 * warp, pb.seq, pb.dh, dq, pb.scale_log2 / log2e);
}

// Scalar fp32: one thread per key row (dK, dV), then one per query row (dQ).
template <class T, int DH>
__global__ void __launch_bounds__(tile)
    key_grads_scalar(const T* qkv, const T* dout, const float* lse, const float* rowdot, T* dqkv, problem pb) {
    __shared__ float qs[scalar_keys][DH], dos[scalar_keys][DH];
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const T* q = head_rows(qkv, stride, pb, b, h);
    const T* d_o = head_rows(dout, H, pb, b, h);
    const int k0 = blockIdx.x * tile, j = k0 + threadIdx.x, limit = key_limit(pb, b);
    float kj[DH], vj[DH], dk[DH], dv[DH];
#pragma unroll
    for (int d = 0; d < DH; ++d) {
        const bool real = j < pb.seq && d < pb.dh;
        kj[d] = real ? to_f(q[long(j) * stride + H + d]) : 0.f;
        vj[d] = real ? to_f(q[long(j) * stride + 2 * H + d]) : 0.f;
        dk[d] = dv[d] = 0.f;
    }
    for (int q0 = k0 < limit ? first_query(pb, k0) : pb.seq; q0 < pb.seq; q0 += scalar_keys) {
        __syncthreads();
        load_rows_f(qs, q, stride, q0, pb.seq, pb.dh);
        load_rows_f(dos, d_o, H, q0, pb.seq, pb.dh);
        __syncthreads();
        for (int ii = 0; ii < scalar_keys; ++ii) {
            const int i = q0 + ii;
            if (i >= pb.seq || j >= pb.seq || !visible(pb, limit, i, j)) continue;
            float s = 0.f, dp = 0.f;
#pragma unroll
            for (int d = 0; d < DH; ++d) s += qs[ii][d] * kj[d], dp += dos[ii][d] * vj[d];
            const float p = exp2f(s * pb.scale_log2 - lse[long(bh) * pb.seq + i]);
            const float ds = p * (dp - rowdot[long(bh) * pb.seq + i]);
#pragma unroll
            for (int d = 0; d < DH; ++d) dv[d] += p * dos[ii][d], dk[d] += ds * qs[ii][d];
        }
    }
    if (j >= pb.seq) return;
    const float scale = pb.scale_log2 / log2e;
    T* row = head_rows(dqkv, stride, pb, b, h) + long(j) * stride;
#pragma unroll
    for (int d = 0; d < DH; ++d)
        if (d < pb.dh) row[H + d] = from_f<T>(dk[d] * scale), row[2 * H + d] = from_f<T>(dv[d]);
}

template <class T, int DH>
__global__ void __launch_bounds__(tile)
    query_grads_scalar(const T* qkv, const T* dout, const float* lse, const float* rowdot, T* dqkv, problem pb) {
    __shared__ float ks[scalar_keys][DH], vs[scalar_keys][DH];
    const auto [bh, b, h, H, stride] = this_block_head(pb);
    const T* q = head_rows(qkv, stride, pb, b, h);
    const T* d_o = head_rows(dout, H, pb, b, h);
    const int q0 = blockIdx.x * tile, i = q0 + threadIdx.x, limit = key_limit(pb, b), end = key_end(pb, limit, q0);
    float qi[DH], doi[DH], dq[DH];
#pragma unroll
    for (int d = 0; d < DH; ++d) {
        const bool real = i < pb.seq && d < pb.dh;
        qi[d] = real ? to_f(q[long(i) * stride + d]) : 0.f;
        doi[d] = real ? to_f(d_o[long(i) * H + d]) : 0.f;
        dq[d] = 0.f;
    }
    const float row_lse = i < pb.seq ? lse[long(bh) * pb.seq + i] : INFINITY;
    const float row_d = i < pb.seq ? rowdot[long(bh) * pb.seq + i] : 0.f;
    for (int k0 = 0; k0 < end; k0 += scalar_keys) {
        __syncthreads();
        load_rows_f(ks, q + H, stride, k0, pb.seq, pb.dh);
        load_rows_f(vs, q + 2 * H, stride, k0, pb.seq, pb.dh);
        __syncthreads();
        for (int jj = 0; jj < scalar_keys; ++jj) {
            if (i >= pb.seq || !visible(pb, limit, i, k0 + jj)) continue;
            float s = 0.f, dp = 0.f;
#pragma unroll
            for (int d = 0; d < DH; ++d) s += qi[d] * ks[jj][d], dp += doi[d] * vs[jj][d];
            const float ds = exp2f(s * pb.scale_log2 - row_lse) * (dp - row_d);
#pragma unroll
            for (int d = 0; d < DH; ++d) dq[d] += ds * ks[jj][d];
        }
    }
    if (i >= pb.seq) return;
    T* row = head_rows(dqkv, stride, pb, b, h) + long(i) * stride;
#pragma unroll
    for (int d = 0; d < DH; ++d)
        if (d < pb.dh) row[d] = from_f<T>(dq[d] * pb.scale_log2 / log2e);
}

template <class E, int DH>
void launch_backward_mma(const E* qkv, const E* dout, const float* lse, const float* rowdot, E* dqkv,
                         const problem& pb, cudaStream_t s) {
    const dim3 grid(blocks_for(pb.seq, tile), pb.batch * pb.heads);
    constexpr int key_bytes = 2 * smem_tile_bytes<DH> + ring_bytes<DH> + 2 * ring_stages<DH> * tile * int(sizeof(float)),
                  query_bytes = 2 * smem_tile_bytes<DH> + ring_bytes<DH>;
    allow_dynamic_smem<key_grads_mma<E, DH>>(key_bytes);
    allow_dynamic_smem<query_grads_mma<E, DH>>(query_bytes);
    key_grads_mma<E, DH><<<grid, threads, key_bytes, s>>>(qkv, dout, lse, rowdot, dqkv, pb);
    CHECKED("flash_attention_backward (dK, dV)");
    query_grads_mma<E, DH><<<grid, threads, query_bytes, s>>>(qkv, dout, lse, rowdot, dqkv, pb);
}
template <class T, int DH>
void launch_backward_scalar(const T* qkv, const T* dout, const float* lse, const float* rowdot, T* dqkv, const problem& pb,
                            cudaStream_t s) {
    const dim3 grid(blocks_for(pb.seq, tile), pb.batch * pb.heads);
    key_grads_scalar<T, DH><<<grid, tile, 0, s>>>(qkv, dout, lse, rowdot, dqkv, pb);
    CHECKED("flash_attention_backward (dK, dV)");
    query_grads_scalar<T, DH><<<grid, tile, 0, s>>>(qkv, dout, lse, rowdot, dqkv, pb);
}

} // namespace

template <class T>
void flash_attention_backward(const T* qkv, const T* out, const float* lse, const T* dout, float* rowdot, T* dqkv, attention_mask mask,
                              const int* lengths, int batch, int seq, int heads, int head_dim, cudaStream_t s) {
    const problem pb = make_problem(mask, lengths, batch, seq, heads, head_dim);
    const long rows = long(batch) * heads * seq;
    rowdot_k<<<blocks_for(rows * 32, elt_threads), elt_threads, 0, s>>>(out, dout, rowdot, pb);
    CHECKED("flash_attention_backward (rowsum dO * O)");
    if (uses_tensor_cores<T>(head_dim)) {
        if constexpr (sixteen_bit<T>) {
            with_head_dim(head_dim, [&]<int DH>() { launch_backward_mma<T, DH>(qkv, dout, lse, rowdot, dqkv, pb, s); });
        }
    } else {
        with_head_dim(head_dim, [&]<int DH>() { launch_backward_scalar<T, DH>(qkv, dout, lse, rowdot, dqkv, pb, s); });
    }
    CHECKED("flash_attention_backward (dQ)");
}

template void flash_attention_backward<float>(const float*, const float*, const float*, const float*, float*, float*, attention_mask,
                                              const int*, int, int, int, int, cudaStream_t);
template void flash_attention_backward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, const float*, const __nv_bfloat16*,
                                                      float*, __nv_bfloat16*, attention_mask, const int*, int, int, int, int,
                                                      cudaStream_t);
template void flash_attention_backward<__half>(const __half*, const __half*, const float*, const __half*,
                                                      float*, __half*, attention_mask, const int*, int, int, int, int,
                                                      cudaStream_t);

} // namespace gpt::kernels
