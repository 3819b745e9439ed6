#pragma once
// Helpers shared by the GPU tests: reading device buffers back, relative errors, random data.

#include "reference.hpp"

#include <gpt/config.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/error.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace support {

template <class T> constexpr const char* precision_name = std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, __half> ? "fp16" : "bf16";

inline double to_double(float x) { return x; }
inline double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
inline double to_double(__half x) { return __half2float(x); }

//! Copies after the work queued on `s` (the model's streams are non-blocking, so a plain
//! cudaMemcpy on the default stream would not wait for them).
template <class T> std::vector<T> download(const T* device, std::size_t n, cudaStream_t s) {
    std::vector<T> host(n);
    CAPSCOPE_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return host;
}
template <class T> std::vector<double> download_as_double(const T* device, std::size_t n, cudaStream_t s) {
    std::vector<double> out;
    for (const T& v : download(device, n, s)) out.push_back(to_double(v));
    return out;
}

//! The values the GPU computes with (already rounded to T), by name.
template <class T> reference::parameters values_of(const gpt::parameter_store<T>& store, cudaStream_t s) {
    reference::parameters out;
    for (std::size_t i = 0; i < store.list().size(); ++i)
        out[store.list()[i].name] = download_as_double(store.value(i), store.list()[i].count, s);
    return out;
}
//! The gradients by name; minus `offset` (the arena's values before backward) when given.
template <class T>
reference::parameters grads_of(const gpt::parameter_store<T>& store, cudaStream_t s, const std::vector<float>* offset = nullptr) {
    reference::parameters out;
    for (std::size_t i = 0; i < store.list().size(); ++i) {
        auto g = download_as_double(store.grad(i), store.list()[i].count, s);
        if (offset)
            for (std::size_t k = 0; k < g.size(); ++k) g[k] -= (*offset)[store.list()[i].offset + k];
        out[store.list()[i].name] = std::move(g);
    }
    return out;
}

//! Fills the gradient arena with small values k * 2^-12 (k in [-8, 8], exact in fp32) and
//! returns them: backward must add to every gradient (it accumulates), so the gradient it
//! computed is what the arena holds afterwards minus these, and one it never wrote shows as 0.
template <class T> std::vector<float> offset_gradients(const gpt::parameter_store<T>& store, std::uint64_t seed, cudaStream_t s) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> k(-8, 8);
    std::vector<float> offset(store.total());
    for (float& x : offset) x = float(k(rng)) * (1.f / 4096.f);
    CAPSCOPE_CHECK(cudaMemcpyAsync(store.grads(), offset.data(), offset.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return offset;
}

//! ||a - b|| / ||b||; NaN anywhere gives infinity (never passes).
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

//! Bitwise equality of two device-read vectors.
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

//! The GPU tests' small model: hidden 64, 4 heads, seq 16, batch 4, 4 experts top-2.
inline gpt::model_config small_model(const char* pattern, gpt::moe_mode mode, double capacity_factor) {
    gpt::model_config c;
    c.vocab = 32;
    c.hidden = 64;
    c.heads = 4;
    c.ffn_hidden = 128;
    c.seq_len = 16;
    c.batch = 4;
    c.layer_pattern = pattern;
    c.experts = 4;
    c.top_k = 2;
    c.moe_mode = mode;
    c.capacity_factor = capacity_factor;
    c.init_stddev = 0.1f;
    return c;
}

//! The float64 checks' tiny model (hidden 16, 2 heads, seq 6, batch 2, 4 experts top-2), small
//! enough for central differences over every weight: the GPU gradient checks' and the peer's
//! CPU check's (tests/bench/peer_reference_case.cpp).
inline gpt::model_config tiny_model(const std::string& pattern, gpt::moe_mode mode, double capacity_factor, std::uint64_t seed) {
    gpt::model_config c;
    c.vocab = 11;
    c.hidden = 16;
    c.heads = 2;
    c.ffn_hidden = 24;
    c.seq_len = 6;
    c.batch = 2;
    c.layer_pattern = pattern;
    c.experts = 4;
    c.top_k = 2;
    c.capacity_factor = capacity_factor;
    c.moe_mode = mode;
    c.seed = seed;
    c.init_stddev = 0.3f; // large enough that attention and routing are far from uniform
    return c;
}

struct batch {
    std::vector<int> tokens, labels;
};
//! Random tokens; labels are the next token, with the last position and every fourth one unlabelled.
inline batch random_batch(int batch_size, int seq, int vocab, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    batch b;
    for (int i = 0; i < batch_size * seq; ++i) b.tokens.push_back(tok(rng));
    for (int i = 0; i < batch_size * seq; ++i) {
        const bool last = i % seq == seq - 1;
        b.labels.push_back(last || i % 4 == 3 ? -1 : b.tokens[i + 1]);
    }
    return b;
}

//! Fills `bytes` at `device` with 0xff: a NaN in fp32 and bf16, which no forward writes. Poison an
//! output before the call under test, so that a call that does nothing (a no-op replay, another
//! bucket's graph) leaves NaNs where the result should be.
inline void poison(const void* device, std::size_t bytes, cudaStream_t s) {
    CAPSCOPE_CHECK(cudaMemsetAsync(const_cast<void*>(device), 0xff, bytes, s));
}
//! Whether `v` holds a NaN (an element the call under test never wrote).
template <class T> bool any_nan(const std::vector<T>& v) {
    for (const T& x : v)
        if (to_double(x) != to_double(x)) return true;
    return false;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

//! `n` values of T, normal with deviation `scale` around `shift` (random_floats, rounded to T).
template <class T> std::vector<T> random_values(std::size_t n, std::uint64_t seed, float scale, float shift = 0.f) {
    std::vector<T> v;
    for (float x : random_floats(n, seed, scale)) v.push_back(T(x + shift));
    return v;
}
template <class T> std::vector<double> as_double(const std::vector<T>& v) {
    std::vector<double> out;
    for (const T& x : v) out.push_back(to_double(x));
    return out;
}

} // namespace support
