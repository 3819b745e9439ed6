#pragma once
// What the fused attention kernels share: the problem, where a head's row lives in the packed
// token-row tensors, the mask, tile loads, and the 16-bit (bf16 or fp16) tensor-core fragments
// (mma.sync m16n8k16).
//
// Layouts. Q, K and V are read where the QKV GEMM wrote them ([B*S, 3H], head h at columns
// h*dh of each third), O and dO are token rows [B*S, H], and dQ, dK, dV are written into one
// [B*S, 3H] gradient, so no head split or merge kernel runs. The log-sum-exp of each query row,
// kept from the forward for the backward, is fp32 [B*heads*S] in base 2 of the scaled logits.

#include "common.cuh"

#include <cstdint>
#include <type_traits>

// Device code for sm_80 and later; older targets compile the tensor-core kernels as traps.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CAPSCOPE_FLASH_SM80 1
#else
#define CAPSCOPE_FLASH_SM80 0
#endif

namespace gpt::kernels::detail::flash {

// A block owns 64 rows (queries, or keys for dK and dV), 16 per warp, and streams the other side
// through shared memory 64 rows at a time. (Two 16-row blocks per warp, which share each loaded
// fragment between two products, measured slower on the H100: 167 against 158 us for the
// forward at h2048 s2048, so shared-memory traffic is not what limits these kernels.)
constexpr int tile = 64;
constexpr int warps = 4;
constexpr int threads = warps * 32;
constexpr float log2e = 1.4426950408889634f;

struct problem {
    int batch, seq, heads, dh;
    float scale_log2; // the softmax scale times log2(e): exp(scale * s) = exp2(scale_log2 * s)
    attention_mask mask;
    const int* lengths; // key_padding: keys [0, lengths[b]) of sample b are real
    __host__ __device__ int hidden() const { return heads * dh; }
};

// Keys that row i of sample b may attend: [0, key_limit(b)), and for causal also j <= i.
__device__ __forceinline__ int key_limit(const problem& p, int b) {
    if (p.mask == attention_mask::causal) return p.seq;
    return min(max(p.lengths[b], 0), p.seq);
}
__device__ __forceinline__ bool visible(const problem& p, int limit, int i, int j) {
    return j < limit && (p.mask != attention_mask::causal || j <= i);
}
// Rows of head (b, h) in a token-row tensor whose rows are `stride` elements apart.
template <class T> __device__ __forceinline__ T* head_rows(T* base, long stride, const problem& p, int b, int h) {
    return base + long(b) * p.seq * stride + long(h) * p.dh;
}

// The end (exclusive) of the keys that the query tile from q0 sees, and the first query that
// sees key k0.
__device__ __forceinline__ int key_end(const problem& p, int limit, int q0) {
    return p.mask == attention_mask::causal ? min(p.seq, q0 + tile) : limit;
}
// The (sample, head) of this block (blockIdx.y), the hidden size, and the packed QKV's row stride.
struct block_head {
    int bh, b, h;
    long H, qkv_stride;
};
__device__ __forceinline__ block_head this_block_head(const problem& p) {
    const int bh = blockIdx.y;
    return {bh, bh / p.heads, bh % p.heads, p.hidden(), 3L * p.hidden()};
}
__device__ __forceinline__ int first_query(const problem& p, int k0) { return p.mask == attention_mask::causal ? k0 : 0; }

// ---- shared-memory tiles of 16-bit elements: [tile][DH + 8] (the pad keeps fragment loads off one
// bank). Untyped: cp.async and ldmatrix move bf16 and fp16 alike; only the mma and the rounding
// of accumulators (pack) know which.
template <int DH> struct smem_tile {
    static constexpr int pitch = DH + 8;
    std::uint16_t* data;
    __device__ std::uint16_t* row(int r) const { return data + r * pitch; }
};
template <int DH> constexpr int smem_tile_bytes = tile * (DH + 8) * 2;
// A ring of stages of two streamed tiles each (K and V, or Q and dO), from `from` on. Stage s is
// read while the next ring_stages - 1 load: each loop step waits for its own tile, passes one
// barrier (which also says every warp is done with the step before), then refills the stage that
// step read, ring_stages - 1 tiles ahead. One barrier a step instead of two took 6% off the
// backward at head_dim 64 on the H100; a third stage measured no faster (297.7 against 294.7 us),
// so two. (An address computed from the stage, not an array indexed by it, which would live in
// local memory.)
template <int DH> constexpr int ring_stages = 2;
template <int DH> struct tile_ring {
    static constexpr int stages = ring_stages<DH>;
    std::uint16_t* from;
    __device__ smem_tile<DH> at(int stage, int which) const { return {from + (2 * stage + which) * tile * smem_tile<DH>::pitch}; }
    __device__ static int next(int stage) { return stage + 1 == stages ? 0 : stage + 1; }
    __device__ static int before(int stage) { return stage == 0 ? stages - 1 : stage - 1; } // the stage to refill
};
template <int DH> constexpr int ring_bytes = 2 * ring_stages<DH> * smem_tile_bytes<DH>;

// Rows [r0, r0 + tile) of a head into shared memory with cp.async, 16 bytes per copy; rows past
// `rows` and columns past dh are zero (a zero-sized source fills the destination with zeros).
// Each thread copies the same column of every (threads / chunks)-th row, so its addresses are
// worked out once and the loop, of a fixed trip count, unrolls: the generic loop over copies cost
// more issue slots than the mma it fed (about 200 instructions a tile, per warp, at head_dim 64).
template <int DH, class E>
__device__ __forceinline__ void load_tile_async(smem_tile<DH> dst, const E* head, long stride, int r0, int rows, int dh) {
    constexpr int chunks = DH / 8, row_step = threads / chunks;
    [[maybe_unused]] constexpr int copies = tile / row_step;
    static_assert(threads % chunks == 0 && tile % row_step == 0, "load_tile_async: a tile's copies split evenly over the threads");
    const int r = threadIdx.x / chunks, col = (threadIdx.x % chunks) * 8;
    const E* src = head + long(r0 + r) * stride + col;
    const bool column_real = col < dh;
#if CAPSCOPE_FLASH_SM80
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst.row(r) + col));
#pragma unroll
    for (int i = 0; i < copies; ++i) {
        const bool real = column_real && r0 + r + i * row_step < rows;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to + unsigned(i * row_step * smem_tile<DH>::pitch * 2)),
                     "l"(real ? src + long(i) * row_step * stride : head), "r"(real ? 16 : 0));
    }
#else
    (void)dst, (void)src, (void)rows, (void)column_real;
    __trap(); // the launchers send older GPUs to the scalar kernels
#endif
}
// The copies this thread issued since the last commit form one group.
__device__ __forceinline__ void commit_tiles() {
#if CAPSCOPE_FLASH_SM80
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Every group but the InFlight most recent ones (the prefetches of the next tiles) has landed,
// this thread's and, after the barrier, every thread's.
template <int InFlight = 0> __device__ __forceinline__ void wait_tiles() {
#if CAPSCOPE_FLASH_SM80
    asm volatile("cp.async.wait_group %0;\n" ::"n"(InFlight));
#endif
    __syncthreads();
}

// ---- mma.sync m16n8k16, 16-bit in (E: bf16 or fp16), fp32 accumulate ----------------------
// Lane l of a warp is (g, t) = (l / 4, l % 4). A 16x16 A fragment holds rows g and g+8, columns
// 2t, 2t+1 and 8+2t, 9+2t; a 16x8 accumulator rows g and g+8, columns 2t, 2t+1; a 16x8 B fragment
// (k x n) k rows 2t, 2t+1 and 8+2t, 9+2t of column g.
struct frag_a {
    unsigned r[4];
};
template <class E> __device__ __forceinline__ void mma(float (&d)[4], const frag_a& a, unsigned b0, unsigned b1) {
    static_assert(sixteen_bit<E>, "mma: bf16 or fp16");
#if CAPSCOPE_FLASH_SM80
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}
// Four 8x8 matrices of 16-bit elements from shared memory; lane l names row l % 8 of matrix l / 8.
// Not transposed, lane l gets row l / 4, columns 2(l % 4) and 2(l % 4) + 1 of each (A fragments,
// and B fragments of a tile whose rows are B's columns). Transposed, it gets column l / 4, rows
// 2(l % 4) and 2(l % 4) + 1: B fragments of k x n where shared memory holds k-major rows (V, dO,
// Q or K as the right operand over keys or queries).
template <bool Transposed> __device__ __forceinline__ void ldmatrix(unsigned (&r)[4], const std::uint16_t* row) {
#if CAPSCOPE_FLASH_SM80
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Transposed)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
#else
    __trap();
#endif
}
// 2^x on the special-function unit, subnormal results flushed to zero (a probability below
// 2^-126 is zero either way); exp2f adds range fix-ups around the same instruction.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// Two floats rounded to a pair of E (to nearest even), as one 32-bit register.
template <class E> __device__ __forceinline__ unsigned pack(float lo, float hi) {
    static_assert(sixteen_bit<E>, "pack: bf16 or fp16");
    if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const unsigned*>(&v);
    } else {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const unsigned*>(&v);
    }
}
// The A fragment of rows [r0, r0+16), columns [c0, c0+16) of a shared tile: matrices 0-3 are
// (rows 0-7, columns 0-7), (rows 8-15, 0-7), (rows 0-7, 8-15), (rows 8-15, 8-15).
template <int DH> __device__ __forceinline__ frag_a load_a(smem_tile<DH> s, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    frag_a a;
    ldmatrix<false>(a.r, s.row(r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) + c0 + 8 * (lane >> 4));
    return a;
}
// Accumulators of columns [16kk, 16kk+16) (two 16x8 tiles) as the A fragment of the next product.
template <class E> __device__ __forceinline__ frag_a as_a(const float (&lo)[4], const float (&hi)[4]) {
    return {{pack<E>(lo[0], lo[1]), pack<E>(lo[2], lo[3]), pack<E>(hi[0], hi[1]), pack<E>(hi[2], hi[3])}};
}
// acc[j] += A(16 x DH) . B where B's column n is row 8j + n of `s` (B = s^T): the product of the
// warp's 16 rows with the tile's 64 rows over DH, e.g. S = Q K^T, given A for each of the DH/16
// k-steps.
template <class E, int DH>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[tile / 8][4], const frag_a (&a)[DH / 16], smem_tile<DH> s) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < tile / 8; j += 2)
#pragma unroll
        for (int kk = 0; kk < DH / 16; ++kk) {
            // B fragments of key tiles j and j+1 at k-step kk: matrices (rows 8j.., columns 16kk),
            // (8j.., 16kk+8), (8j+8.., 16kk), (8j+8.., 16kk+8).
            unsigned b[4];
            ldmatrix<false>(b, s.row(8 * j + (lane & 7) + 8 * (lane >> 4)) + 16 * kk + 8 * ((lane >> 3) & 1));
            mma<E>(acc[j], a[kk], b[0], b[1]);
            mma<E>(acc[j + 1], a[kk], b[2], b[3]);
        }
}
// acc[n] += P(16 x 64) . s where P comes as accumulators over the tile's 64 rows (k) and s is the
// tile itself (k-major rows, DH columns): O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.
template <class E, int DH>
__device__ __forceinline__ void acc_times_tile(float (&acc)[DH / 8][4], const float (&p)[tile / 8][4], smem_tile<DH> s) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < tile / 16; ++kk) {
        const frag_a a = as_a<E>(p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < DH / 16; ++dn) {
            // Matrices (k rows 16kk.., n columns 16dn), (16kk+8.., 16dn), (16kk.., 16dn+8), (16kk+8.., 16dn+8).
            unsigned b[4];
            ldmatrix<true>(b, s.row(16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) + 16 * dn + 8 * (lane >> 4));
            mma<E>(acc[2 * dn], a, b[0], b[1]);
            mma<E>(acc[2 * dn + 1], a, b[2], b[3]);
        }
    }
}
// Writes 16 rows of accumulators [16 x DH] times `scale` to rows r0.. of a head (rows < `rows`,
// columns < dh), as pairs of E.
template <class E, int DH>
__device__ __forceinline__ void store_rows(E* head, long stride, int r0, int rows, int dh, const float (&acc)[DH / 8][4],
                                           float scale) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
        const int col = 8 * n + 2 * t;
        if (col >= dh) continue;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = r0 + g + 8 * half;
            if (r >= rows) continue;
            *reinterpret_cast<unsigned*>(head + long(r) * stride + col) = pack<E>(acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale);
        }
    }
}

} // namespace gpt::kernels::detail::flash
