#pragma once
// Host launchers of the model's kernels (definitions in kernels/, one file per idea). Every launcher checks its
// launch. Reductions that feed a result use a fixed order (no float atomics), so a step is
// bitwise reproducible.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gpt/config.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpt::kernels {

enum class attention_mask { causal, key_padding };

template <class T> void cast_from_float(const float* in, T* out, long n, cudaStream_t s);
template <class T> void cast_to_float(const T* in, float* out, long n, cudaStream_t s);
//! Zeroes rows [*valid_samples * rows_per_sample, rows) of x [rows, cols]: the padded samples of
//! an inference bucket (the count is read on the device, so a graph replays it for any request).
template <class T> void zero_padded_rows(T* x, const int* valid_samples, int rows_per_sample, int rows, int cols, cudaStream_t s);

// Parameter gradients (dg, dtok, dpos here; the GEMMs with beta 1) accumulate: a step clears them
// once (zero_grad) and every microbatch's backward adds to them.

// RMSNorm: y = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
template <class T> void rms_norm_forward(const T* x, const T* g, T* y, float* rstd, int rows, int cols, cudaStream_t s);
// dx = (residual_grad ? residual_grad : 0) + d(norm)/dx . dy
template <class T>
void rms_norm_backward(const T* x, const T* g, const float* rstd, const T* dy, const T* residual_grad, T* dx, int rows,
                       int cols, cudaStream_t s);
template <class T> void rms_norm_weight_grad(const T* x, const float* rstd, const T* dy, float* dg, int rows, int cols, cudaStream_t s);

// Fused attention over the packed QKV of a layer ([B*S, 3H], as the QKV GEMM writes it, head h
// at columns h*dh of each third): out [B*S, H] = softmax(QK^T / sqrt(dh) + mask) V, without an
// S x S buffer. lse [B*heads*S] keeps each query row's log-sum-exp (base 2) for the backward.
// causal: row i sees keys <= i; key_padding: every row of sample b sees keys < lengths[b] (a row
// that sees none gets zeros). head_dim is at most gpt::max_head_dim. bf16 and fp16 run on tensor
// cores (sm_80+); fp32 in fp32 on the scalar path.
template <class T>
void flash_attention_forward(const T* qkv, T* out, float* lse, attention_mask mask, const int* lengths, int batch, int seq, int heads,
                             int head_dim, cudaStream_t s);
// dqkv [B*S, 3H] = d(loss)/d(qkv) given dout = d(loss)/d(out); rowdot [B*heads*S] is scratch.
// Deterministic: each gradient element is summed by one thread in a fixed order (no atomics).
template <class T>
void flash_attention_backward(const T* qkv, const T* out, const float* lse, const T* dout, float* rowdot, T* dqkv, attention_mask mask,
                              const int* lengths, int batch, int seq, int heads, int head_dim, cudaStream_t s);

template <class T> void gelu_forward(const T* x, T* y, long n, cudaStream_t s);
//! y = x + dropout(z): keeps z[i] / (1 - p) where hash(rng.seed, rng.offset, i) >= p, records the
//! mask, then advances rng.offset by one (all read and written in device memory).
template <class T> void dropout_add_forward(const T* z, const T* x, T* y, unsigned char* mask, gpt::rng_state* rng, float p, long n, cudaStream_t s);
//! dz = dy * mask / (1 - p)
template <class T> void dropout_backward(const T* dy, const unsigned char* mask, T* dz, float p, long n, cudaStream_t s);
//! Sets the generator's seed and offset (set-up, or a trainer's explicit reseed).
void set_rng(gpt::rng_state* device, std::uint64_t seed, std::uint64_t offset, cudaStream_t s);
template <class T> void gelu_backward(const T* x, const T* dy, T* dx, long n, cudaStream_t s);

template <class T>
void embedding_forward(const int* tokens, const T* tok, const T* pos, T* out, int batch, int seq, int hidden, cudaStream_t s);
template <class T>
void embedding_backward(const int* tokens, const T* dout, float* dtok, float* dpos, int vocab, int max_pos, int batch, int seq,
                        int hidden, cudaStream_t s);
// Row-broadcast of a position table onto [B*S, H] (vision patches): out += pos[s].
template <class T> void add_positions(T* x, const T* pos, int batch, int seq, int hidden, cudaStream_t s);
template <class T> void position_grad(const T* dout, float* dpos, int max_pos, int batch, int seq, int hidden, cudaStream_t s);

// Mean cross-entropy over labels != -1. Writes the scalar loss and dlogits = grad_scale *
// *loss_scale * d(loss)/d(logits) (grad_scale = 1 / microbatches: the step's loss is the
// microbatches' mean; loss_scale, when given, is dynamic loss scaling's factor, read on the device).
// The loss itself is never scaled.
template <class T>
void cross_entropy(const T* logits, const int* labels, float* row_loss, float* loss, float* valid_count, T* dlogits, int rows,
                   int vocab, float grad_scale, cudaStream_t s, const float* loss_scale = nullptr);

// MoE. Top-k by logit (ties to the lower expert), gates = softmax over the k chosen logits.
template <class T> void router_topk(const T* logits, int* expert, float* gate, int tokens, int experts, int k, cudaStream_t s);
template <class T>
void router_topk_backward(const int* expert, const float* gate, const float* dgate, T* dlogits, int tokens, int experts, int k,
                          cudaStream_t s);
// Assignment (t, j) -> row of the permuted buffer, in token order per expert. capacity > 0:
// drop-and-pad (row e*capacity + position, -1 once full); capacity == 0: dropless (rows packed
// by expert, offsets from the counts). row_owner[r] = t*k + j, or -1 for a padding row. With
// `overflow` (capacity > 0 only), an expert given more than `capacity` assignments sets *overflow
// to 1 (a static dropless capacity: the step is rerun) and leaves it as it is otherwise.
void assign_slots(const int* expert, int* counts, int* slot, int* row_owner, int tokens, int k, int experts, int capacity,
                  cudaStream_t s, int* overflow = nullptr);
template <class T> void permute_rows(const T* x, const int* row_owner, T* out, int rows, int hidden, int k, cudaStream_t s);
template <class T>
void permute_rows_backward(const T* dout, const int* slot, T* dx, int tokens, int hidden, int k, cudaStream_t s);
template <class T>
void combine(const T* expert_out, const int* slot, const float* gate, const T* residual, T* y, int tokens, int hidden, int k,
             cudaStream_t s);
template <class T>
void combine_backward(const T* dy, const T* expert_out, const int* slot, const int* row_owner, const float* gate,
                      T* dexpert_out, float* dgate, int tokens, int rows, int hidden, int k, cudaStream_t s);

// Mamba-style gated recurrence over proj = [u | z | a_logit] ([B*S, 3D]):
// a = sigmoid(a_logit), h_t = a h_{t-1} + (1 - a) u, y = h * silu(z).
template <class T> void gated_scan_forward(const T* proj, float* h, T* y, int batch, int seq, int inner, cudaStream_t s);
template <class T>
void gated_scan_backward(const T* proj, const float* h, const T* dy, T* dproj, int batch, int seq, int inner, cudaStream_t s);

// Greedy decoding with a KV cache (decode.cu). The loop's state lives on the device, so a replay
// of a decode step reads what the last pass wrote: `flag` (nonzero: another pass), `step` (tokens
// out so far), `position` (where the next token goes), per sequence `done`, `last` (the token to
// feed) and `generated` [rows, max_new]. A step run past the last changes no generated token and
// not the flag, and writes nothing out of bounds (step >= max_new, position >= seq_len are checked).
struct decode_state {
    int *flag, *step, *position, *done, *last, *generated;
};
// Keys and values of a prompt's qkv rows (b*prompt + s) into the cache [rows, seq_cap, hidden] each.
template <class T> void kv_cache_fill(const T* qkv, T* cache_k, T* cache_v, int rows, int prompt, int hidden, int seq_cap, cudaStream_t s);
// The new token's key and value (qkv row b) at *position.
template <class T>
void kv_cache_append(const T* qkv, T* cache_k, T* cache_v, const int* position, int rows, int hidden, int seq_cap, cudaStream_t s);
// Causal attention of one query per sequence (qkv row b) over cached positions 0..*position. Its
// scores live in shared memory: (seq_cap + dh) floats, within 48 KiB less the reductions' own.
inline std::size_t decode_attention_shared_bytes(int seq_cap, int dh) { return (std::size_t(seq_cap) + std::size_t(dh)) * sizeof(float); }
constexpr std::size_t decode_attention_shared_limit = 48 * 1024 - 256;
template <class T>
void decode_attention(const T* qkv, const T* cache_k, const T* cache_v, const int* position, T* out, int rows, int heads, int dh,
                      int seq_cap, cudaStream_t s);
template <class T>
void decode_embedding(const int* last, const int* position, const T* tok, const T* pos, T* out, int rows, int hidden, int positions,
                      cudaStream_t s);
// The scan's state at the prompt's last position, and one step from it (state updated in place).
void scan_state_fill(const float* h, float* state, int rows, int prompt, int inner, cudaStream_t s);
template <class T> void scan_step(const T* proj, float* state, T* y, int rows, int inner, cudaStream_t s);
// done = 0 for `rows` sequences, step = 0.
void decode_begin(const decode_state& st, int rows, cudaStream_t s);
// generated[b][*step] = last[b] = the index of row b*row_stride + row_offset's largest logit (or
// end_token once sequence b has ended); done[b] = 1 when it is end_token.
template <class T>
void greedy_pick(const T* logits, int row_stride, int row_offset, int rows, int vocab, const decode_state& st, int end_token, int max_new,
                 cudaStream_t s);
// ++step; position = prompt - 1 + step; flag = some real sequence (of *valid) is open and step <
// max_new. A loop that stops before max_new fills the rest of every row with end_token.
void decode_advance(const decode_state& st, const int* valid, int rows, int prompt, int max_new, int end_token, cudaStream_t s);

// AdamW. The step count and the hyperparameters live on the device: the step count is advanced by
// the same call (by the first of a step's calls, when several arenas are stepped), and the hyperparameters are set by a launch of their own, so a step replayed
// from a graph follows both (bias corrections, a learning-rate schedule).
struct adamw_hyperparameters {
    float lr, beta1, beta2, eps, weight_decay;
};
void set_adamw_hyperparameters(adamw_hyperparameters* device, const adamw_hyperparameters& values, cudaStream_t s);
template <class T>
void adamw(float* master, T* param, const float* grad, float* m, float* v, long n, int* step, const adamw_hyperparameters* hyper,
           cudaStream_t s, bool advance_step = true, const float* inverse_loss_scale = nullptr);

// The finite check of loss and gradients, on the device (capscope's nan_check_on_device): the
// flag starts at 1 (set_int), each checked array clears it on an inf or a NaN (any thread may: all
// write 0, so the result does not depend on their order), and count_if_cleared adds one to a
// device counter of skipped steps when the flag is 0.
void set_int(int* x, int value, cudaStream_t s);
void clear_unless_finite(const float* x, long n, int* flag, cudaStream_t s);
void count_if_cleared(const int* flag, int* count, cudaStream_t s);
// A pipeline chunk's microbatch, read on the device (a pass replayed from a graph serves every
// microbatch of its slot): `dst` = row `*index` of `rows` (n ints each); `dst[*index]` = `*value`;
// `*index` += 1 (after the pass's last read of it). An index at or past `count` (more forwards than
// microbatches since the counter was reset) reads and writes nothing and sets `*overrun` to 1.
void copy_row_at(const int* rows, const int* index, int count, int* dst, int n, int* overrun, cudaStream_t s);
void store_at(const float* value, const int* index, int count, float* dst, int* overrun, cudaStream_t s);
void increment(int* x, cudaStream_t s);
void set_float(float* x, float value, cudaStream_t s);
// A step's update under a static dropless expert capacity: may_update = no expert overflowed and
// (without a finite check: all_finite null) loss and gradients finite.
void update_gate(const int* overflow, const int* all_finite, int* may_update, cudaStream_t s);

// Dynamic loss scaling (fp16): the loss's gradient is multiplied by `scale` (cross_entropy) and
// AdamW multiplies the gradients by `inverse`. The scale is a power of two, so both are exact wherever
// nothing overflows or underflows. After the step: a step that was not finite halves it, and
// `growth_interval` finite steps in a row double it, within [smallest, largest].
void update_loss_scale(const int* all_finite, loss_scale_state* state, int growth_interval, cudaStream_t s);
//! scale = `scale`, clean_steps = 0 (set-up).
void set_loss_scale(loss_scale_state* state, float scale, cudaStream_t s);

} // namespace gpt::kernels
