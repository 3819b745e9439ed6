// Greedy decoding in the blocks that keep something from one position to the next: attention
// its keys and values (the KV cache), the Mamba-style scan its state. The other blocks decode with
// their forward on one position (block::decode_forward).

#include <gpt/blocks.hpp>

#include "block_support.hpp"
#include "gemm.hpp"
#include "kernels.hpp"

#include <stdexcept>

namespace gpt {

using capscope::cuda::device_buffer;
using detail::copy_rows;
using detail::gemm;
using detail::n_elems;

template <class T> void attention_block<T>::allocate_decode() {
    if (kind_ != attention_kind::causal) throw std::invalid_argument(this->name_ + ": decoding needs causal attention");
    if (cache_k_.empty()) {
        cache_k_ = device_buffer<T>(n_elems(this->shape_.tokens(), this->shape_.hidden));
        cache_v_ = device_buffer<T>(n_elems(this->shape_.tokens(), this->shape_.hidden));
    }
}
template <class T> void attention_block<T>::begin_decode(cudaStream_t s, token_grid prompt) {
    kernels::kv_cache_fill(qkv_.data(), cache_k_.data(), cache_v_.data(), prompt.batch, prompt.seq, this->shape_.hidden, this->shape_.seq, s);
}
template <class T> void attention_block<T>::decode_forward(cudaStream_t s, int rows, const int* position) {
    const auto& sh = this->shape_;
    const int h = sh.hidden;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), rows, h, s);
    gemm(this->blas_, s, {false, false, rows, 3 * h, h}, normed_.data(), P.value(qkv_w_), qkv_.data());
    kernels::kv_cache_append(qkv_.data(), cache_k_.data(), cache_v_.data(), position, rows, h, sh.seq, s);
    kernels::decode_attention(qkv_.data(), cache_k_.data(), cache_v_.data(), position, merged_.data(), rows, sh.heads, h / sh.heads, sh.seq, s);
    copy_rows(this->y_.data(), this->x_, n_elems(rows, h), s);
    gemm(this->blas_, s, {false, false, rows, h, h}, merged_.data(), P.value(out_w_), this->y_.data(), 1.f);
}
template <class T> void mamba_block<T>::allocate_decode() {
    if (decode_state_.empty()) decode_state_ = device_buffer<float>(n_elems(this->shape_.batch, this->shape_.inner));
}
template <class T> void mamba_block<T>::begin_decode(cudaStream_t s, token_grid prompt) {
    kernels::scan_state_fill(state_.data(), decode_state_.data(), prompt.batch, prompt.seq, this->shape_.inner, s);
}
template <class T> void mamba_block<T>::decode_forward(cudaStream_t s, int rows, const int*) {
    const auto& sh = this->shape_;
    const int h = sh.hidden, d = sh.inner;
    auto& P = this->params_;
    kernels::rms_norm_forward(this->x_, P.value(norm_), normed_.data(), rstd_.data(), rows, h, s);
    gemm(this->blas_, s, {false, false, rows, 3 * d, h}, normed_.data(), P.value(in_proj_), proj_.data());
    kernels::scan_step(proj_.data(), decode_state_.data(), mixed_.data(), rows, d, s);
    copy_rows(this->y_.data(), this->x_, n_elems(rows, h), s);
    gemm(this->blas_, s, {false, false, rows, h, d}, mixed_.data(), P.value(out_proj_), this->y_.data(), 1.f);
}

// The class templates are instantiated in blocks.cu; these are their decoding members.
#define INSTANTIATE(Block, T) \
    template void Block<T>::allocate_decode(); \
    template void Block<T>::begin_decode(cudaStream_t, token_grid); \
    template void Block<T>::decode_forward(cudaStream_t, int, const int*);
INSTANTIATE(attention_block, float)
INSTANTIATE(attention_block, __nv_bfloat16)
INSTANTIATE(attention_block, __half)
INSTANTIATE(mamba_block, float)
INSTANTIATE(mamba_block, __nv_bfloat16)
INSTANTIATE(mamba_block, __half)

} // namespace gpt
