// The fused attention kernels against float64 attention written from the formulas: outputs and
// the gradients of Q, K and V, causal and key-padded (a sample with no keys included), at head
// widths that fill their tile (32, 64, 128) and ones that do not (8, 12, 40), sequence lengths
// that are and are not multiples of the 64-row tile; and the backward twice, bit for bit.

#include "kernels.hpp"
#include "support.hpp"

#include <capscope/cuda.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using gpt::kernels::attention_mask;

struct shape {
    int batch, seq, heads, dh;
    int hidden() const { return heads * dh; }
    std::size_t rows() const { return std::size_t(batch) * seq; }
};

struct grads {
    std::vector<double> out, dqkv; // [B*S, H], [B*S, 3H]
};

// Attention in float64 over the packed layout the kernels read.
grads reference(const shape& sh, const std::vector<double>& qkv, const std::vector<double>& dout, attention_mask mask,
                const std::vector<int>& lengths) {
    const int S = sh.seq, H = sh.hidden(), dh = sh.dh;
    const double scale = 1.0 / std::sqrt(double(dh));
    grads r{std::vector<double>(sh.rows() * H), std::vector<double>(sh.rows() * 3 * H)};
    auto at = [&](int b, int s, int part, int h, int d) { return (std::size_t(b) * S + s) * 3 * H + std::size_t(part) * H + h * dh + d; };
    auto row = [&](int b, int s, int h, int d) { return (std::size_t(b) * S + s) * H + h * dh + d; };
    std::vector<double> p(S), dp(S);
    for (int b = 0; b < sh.batch; ++b)
        for (int h = 0; h < sh.heads; ++h)
            for (int i = 0; i < S; ++i) {
                auto seen = [&](int j) { return mask == attention_mask::causal ? j <= i : j < lengths[b]; };
                double mx = -std::numeric_limits<double>::infinity(), sum = 0;
                for (int j = 0; j < S; ++j) {
                    double s = 0;
                    for (int d = 0; d < dh; ++d) s += qkv[at(b, i, 0, h, d)] * qkv[at(b, j, 1, h, d)];
                    p[j] = seen(j) ? s * scale : -std::numeric_limits<double>::infinity();
                    mx = std::max(mx, p[j]);
                }
                for (int j = 0; j < S; ++j) sum += p[j] = seen(j) ? std::exp(p[j] - mx) : 0.0;
                for (int j = 0; j < S; ++j) p[j] = sum > 0 ? p[j] / sum : 0.0;
                for (int d = 0; d < dh; ++d)
                    for (int j = 0; j < S; ++j) r.out[row(b, i, h, d)] += p[j] * qkv[at(b, j, 2, h, d)];
                // dP = dO V^T, dS = P (dP - sum_j P dP), dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO
                double dot = 0;
                for (int j = 0; j < S; ++j) {
                    dp[j] = 0;
                    for (int d = 0; d < dh; ++d) dp[j] += dout[row(b, i, h, d)] * qkv[at(b, j, 2, h, d)];
                    dot += p[j] * dp[j];
                }
                for (int j = 0; j < S; ++j) {
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    for (int d = 0; d < dh; ++d) {
                        r.dqkv[at(b, i, 0, h, d)] += ds * qkv[at(b, j, 1, h, d)];
                        r.dqkv[at(b, j, 1, h, d)] += ds * qkv[at(b, i, 0, h, d)];
                        r.dqkv[at(b, j, 2, h, d)] += p[j] * dout[row(b, i, h, d)];
                    }
                }
            }
    return r;
}

// Relative L2 error, against at least an RMS of 0.1: a gradient that is zero in exact arithmetic
// (dQ and dK of a row that sees one key) is only rounding noise in any precision.
double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
    return std::sqrt(num / std::max(den, 1e-2 * double(got.size())));
}

template <class T> std::vector<T> random_values(std::size_t n, unsigned seed, float stddev) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.f, stddev);
    std::vector<T> v(n);
    for (T& x : v) x = T(dist(gen));
    return v;
}
using support::as_double;

template <class T> void check(const shape& sh, attention_mask mask, std::vector<int> lengths) {
    if (lengths.empty()) lengths.assign(std::size_t(sh.batch), sh.seq);
    const int H = sh.hidden();
    capscope::cuda::stream s;
    // Queries twice as large as keys: softmax rows far from uniform.
    auto qkv = random_values<T>(sh.rows() * 3 * H, 1 + sh.seq + sh.dh, 1.f);
    for (std::size_t r = 0; r < sh.rows(); ++r)
        for (int c = 0; c < H; ++c) qkv[r * 3 * H + c] = T(2.f * float(qkv[r * 3 * H + c]));
    const auto dout = random_values<T>(sh.rows() * H, 7 + sh.seq, 1.f);
    capscope::cuda::device_buffer<T> d_qkv(qkv.size()), d_out(sh.rows() * H), d_dout(dout.size()), d_grad(qkv.size());
    capscope::cuda::device_buffer<float> lse(sh.rows() * sh.heads), rowdot(sh.rows() * sh.heads);
    capscope::cuda::device_buffer<int> d_lengths(lengths.size());
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_qkv.data(), qkv.data(), qkv.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_dout.data(), dout.data(), dout.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_lengths.data(), lengths.data(), lengths.size() * sizeof(int), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemsetAsync(d_grad.data(), 0xff, d_grad.bytes(), s)); // every element must be written

    auto run = [&] {
        gpt::kernels::flash_attention_forward(d_qkv.data(), d_out.data(), lse.data(), mask, d_lengths.data(), sh.batch, sh.seq, sh.heads,
                                              sh.dh, s);
        gpt::kernels::flash_attention_backward(d_qkv.data(), d_out.data(), lse.data(), d_dout.data(), rowdot.data(), d_grad.data(), mask,
                                               d_lengths.data(), sh.batch, sh.seq, sh.heads, sh.dh, s);
        return std::pair{support::download(d_out.data(), sh.rows() * H, s), support::download(d_grad.data(), qkv.size(), s)};
    };
    const auto [out, grad] = run();
    const grads want = reference(sh, as_double(qkv), as_double(dout), mask, lengths);
    const auto got_grad = as_double(grad);
    auto part = [&](const std::vector<double>& g, int which) {
        std::vector<double> p;
        for (std::size_t r = 0; r < sh.rows(); ++r)
            p.insert(p.end(), g.begin() + long(r * 3 * H + which * H), g.begin() + long(r * 3 * H + (which + 1) * H));
        return p;
    };
    // fp16's 10 mantissa bits measure within 5.5e-4, bf16's 7 within 4e-3.
    const double bound = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, __half> ? 2e-3 : 2e-2;
    const double e_out = rel_l2(as_double(out), want.out), e_q = rel_l2(part(got_grad, 0), part(want.dqkv, 0)),
                 e_k = rel_l2(part(got_grad, 1), part(want.dqkv, 1)), e_v = rel_l2(part(got_grad, 2), part(want.dqkv, 2));
    std::printf("  %s %-11s b%d s%-4d heads %d dh %-3d  rel. L2: out %.1e  dQ %.1e  dK %.1e  dV %.1e (bound %.0e)\n",
                support::precision_name<T>, mask == attention_mask::causal ? "causal" : "key_padding", sh.batch, sh.seq, sh.heads, sh.dh,
                e_out, e_q, e_k, e_v, bound);
    CHECK(e_out < bound);
    CHECK(e_q < bound);
    CHECK(e_k < bound);
    CHECK(e_v < bound);
    // Run to run: the same bits (no atomics in any reduction).
    const auto [out2, grad2] = run();
    CHECK(std::memcmp(out.data(), out2.data(), out.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(grad.data(), grad2.data(), grad.size() * sizeof(T)) == 0);
}

} // namespace

TEST_CASE_TEMPLATE("fused attention equals float64 attention, forward and backward, and repeats bit for bit", T, float, __nv_bfloat16, __half) {
    for (int seq : {1, 17, 64, 130})
        for (int dh : {8, 32, 40, 64, 128}) {
            CAPTURE(seq);
            CAPTURE(dh);
            check<T>({2, seq, 3, dh}, attention_mask::causal, {});
            check<T>({3, seq, 2, dh}, attention_mask::key_padding, {seq, (seq + 1) / 3, 0});
        }
    // A head width off the 16-byte grid: bf16 takes the scalar path.
    check<T>({2, 70, 2, 12}, attention_mask::causal, {});
    check<T>({2, 70, 2, 12}, attention_mask::key_padding, {70, 9});
}

TEST_CASE("fused attention rejects a head wider than its tile, and key padding without lengths") {
    capscope::cuda::stream s;
    capscope::cuda::device_buffer<float> x(1024), lse(64);
    CHECK_THROWS_WITH_AS(gpt::kernels::flash_attention_forward(x.data(), x.data(), lse.data(), attention_mask::causal, nullptr, 1, 1, 1, 129, s),
                         "fused attention: head_dim 129 is outside [1, 128]; use more heads (narrower ones)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(gpt::kernels::flash_attention_forward(x.data(), x.data(), lse.data(), attention_mask::key_padding, nullptr, 1, 4, 1, 8, s),
                         "fused attention: key_padding needs the device array of lengths", std::invalid_argument);
}

// Small enough for racecheck (scripts/gpu-check.sh): both masks, a partial last tile, both paths.
TEST_CASE("fused attention, a few shapes for the sanitizers") {
    check<__nv_bfloat16>({2, 130, 2, 64}, attention_mask::causal, {});
    check<__nv_bfloat16>({2, 130, 2, 64}, attention_mask::key_padding, {130, 40});
    check<__half>({2, 130, 2, 64}, attention_mask::causal, {});
    check<float>({1, 70, 2, 16}, attention_mask::causal, {});
}
