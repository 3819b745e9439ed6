// The chunked gated scan and the tiled MoE slot assignment, white-box: the scan against the
// recurrence walked in float64 (states, outputs and the three input gradients), at lengths that
// are and are not multiples of its 32 stretches and widths off its 32-channel tile; the slot
// assignment against a host walk in token order, exactly, with drops, padding rows and tiles that
// end mid-warp; both repeated bit for bit. And the embedding backward against a host walk in row
// order, bit for bit.

#include "kernels.hpp"
#include "support.hpp"

#include <capscope/cuda.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using support::as_double;
using support::random_values;
using support::relative_error;

struct scan_shape {
    int batch, seq, inner;
    std::size_t rows() const { return std::size_t(batch) * seq; }
};

struct scan_result {
    std::vector<double> h, y, dproj;
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// h_t = a h_{t-1} + (1 - a) u, y = h silu(z), walked in order; the gradients walked in reverse.
scan_result reference_scan(const scan_shape& sh, const std::vector<double>& proj, const std::vector<double>& dy) {
    const int D = sh.inner;
    scan_result r{std::vector<double>(sh.rows() * D), std::vector<double>(sh.rows() * D), std::vector<double>(sh.rows() * 3 * D)};
    auto at = [&](int b, int s) { return std::size_t(b) * sh.seq + std::size_t(s); };
    for (int b = 0; b < sh.batch; ++b)
        for (int d = 0; d < D; ++d) {
            double state = 0;
            for (int s = 0; s < sh.seq; ++s) {
                const std::size_t t = at(b, s);
                const double u = proj[t * 3 * D + d], z = proj[t * 3 * D + D + d], a = sigmoid(proj[t * 3 * D + 2 * D + d]);
                state = a * state + (1 - a) * u;
                r.h[t * D + d] = state;
                r.y[t * D + d] = state * z * sigmoid(z);
            }
            double carry = 0;
            for (int s = sh.seq - 1; s >= 0; --s) {
                const std::size_t t = at(b, s);
                const double u = proj[t * 3 * D + d], z = proj[t * 3 * D + D + d], a = sigmoid(proj[t * 3 * D + 2 * D + d]);
                const double hprev = s > 0 ? r.h[(t - 1) * D + d] : 0.0, sz = sigmoid(z), g = dy[t * D + d];
                const double dh = g * z * sz + carry;
                r.dproj[t * 3 * D + D + d] = g * r.h[t * D + d] * sz * (1 + z * (1 - sz));
                r.dproj[t * 3 * D + d] = dh * (1 - a);
                r.dproj[t * 3 * D + 2 * D + d] = dh * (hprev - u) * a * (1 - a);
                carry = dh * a;
            }
        }
    return r;
}

template <class T> void check_scan(const scan_shape& sh) {
    capscope::cuda::stream s;
    const std::size_t n = sh.rows() * sh.inner;
    // Gate logits near +2 (a ~ 0.88): a long memory, so a stretch's carry reaches far.
    auto proj = random_values<T>(n * 3, 11 + unsigned(sh.seq), 1.f);
    for (std::size_t t = 0; t < sh.rows(); ++t)
        for (int d = 0; d < sh.inner; ++d) {
            T& logit = proj[t * 3 * sh.inner + 2 * sh.inner + d];
            logit = T(float(logit) * 0.5f + 2.f);
        }
    const auto dy = random_values<T>(n, 5 + unsigned(sh.inner), 1.f);
    capscope::cuda::device_buffer<T> d_proj(proj.size()), d_y(n), d_dy(n), d_dproj(proj.size());
    capscope::cuda::device_buffer<float> d_h(n);
    d_proj.copy_from_host(proj, s);
    d_dy.copy_from_host(dy, s);
    // Every element must be written.
    CAPSCOPE_CHECK(cudaMemsetAsync(d_h.data(), 0xff, d_h.bytes(), s));
    CAPSCOPE_CHECK(cudaMemsetAsync(d_y.data(), 0xff, d_y.bytes(), s));
    CAPSCOPE_CHECK(cudaMemsetAsync(d_dproj.data(), 0xff, d_dproj.bytes(), s));
    auto run = [&] {
        gpt::kernels::gated_scan_forward(d_proj.data(), d_h.data(), d_y.data(), sh.batch, sh.seq, sh.inner, s.get());
        gpt::kernels::gated_scan_backward(d_proj.data(), d_h.data(), d_dy.data(), d_dproj.data(), sh.batch, sh.seq, sh.inner, s.get());
        return std::tuple{support::download(d_h.data(), n, s), support::download(d_y.data(), n, s),
                          support::download(d_dproj.data(), proj.size(), s)};
    };
    const auto [h, y, dproj] = run();
    const scan_result want = reference_scan(sh, as_double(proj), as_double(dy));
    const bool fp32 = std::is_same_v<T, float>;
    const double bound = fp32 ? 1e-5 : 1e-2;
    const double e_h = relative_error(as_double(h), want.h), e_y = relative_error(as_double(y), want.y),
                 e_d = relative_error(as_double(dproj), want.dproj);
    std::printf("  scan %s b%d s%-5d inner %-3d  rel. L2: h %.1e  y %.1e  dproj %.1e (bound %.0e)\n", support::precision_name<T>, sh.batch,
                sh.seq, sh.inner, e_h, e_y, e_d, bound);
    CHECK(e_h < bound);
    CHECK(e_y < bound);
    CHECK(e_d < bound);
    const auto [h2, y2, dproj2] = run();
    CHECK(std::memcmp(h.data(), h2.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(y.data(), y2.data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(dproj.data(), dproj2.data(), proj.size() * sizeof(T)) == 0);
}

struct slots {
    std::vector<int> counts, slot, row_owner;
};

// Assignment a = t*k + j goes to its expert's next row, in token order; past capacity it is
// dropped (-1); rows an expert does not fill are padding (-1). capacity 0: dropless, packed.
slots reference_slots(const std::vector<int>& expert, int experts, int capacity) {
    std::vector<int> seen(std::size_t(experts), 0), offset(std::size_t(experts) + 1, 0);
    for (int e : expert) ++seen[std::size_t(e)];
    for (int e = 0; e < experts; ++e) offset[std::size_t(e) + 1] = offset[std::size_t(e)] + (capacity > 0 ? capacity : seen[std::size_t(e)]);
    slots r{std::vector<int>(std::size_t(experts)), std::vector<int>(expert.size()), std::vector<int>(std::size_t(offset.back()), -1)};
    std::vector<int> pos(std::size_t(experts), 0);
    for (std::size_t a = 0; a < expert.size(); ++a) {
        const std::size_t e = std::size_t(expert[a]);
        if (capacity > 0 && pos[e] >= capacity) {
            r.slot[a] = -1;
        } else {
            r.slot[a] = offset[e] + pos[e];
            r.row_owner[std::size_t(r.slot[a])] = int(a);
        }
        ++pos[e];
    }
    for (int e = 0; e < experts; ++e) r.counts[std::size_t(e)] = capacity > 0 ? std::min(seen[std::size_t(e)], capacity) : seen[std::size_t(e)];
    return r;
}

// Distinct experts per token, skewed towards the low ones so that some overflow their capacity.
std::vector<int> random_routing(int tokens, int k, int experts, unsigned seed) {
    std::mt19937 gen(seed);
    std::vector<double> weight;
    for (int e = 0; e < experts; ++e) weight.push_back(1.0 / (1 + e));
    std::discrete_distribution<int> pick(weight.begin(), weight.end());
    std::vector<int> expert;
    for (int t = 0; t < tokens; ++t) {
        std::vector<int> chosen;
        while (int(chosen.size()) < k) {
            const int e = pick(gen);
            if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        expert.insert(expert.end(), chosen.begin(), chosen.end());
    }
    return expert;
}

void check_slots(int tokens, int k, int experts, int capacity) {
    CAPTURE(tokens);
    CAPTURE(k);
    CAPTURE(experts);
    CAPTURE(capacity);
    capscope::cuda::stream s;
    const auto expert = random_routing(tokens, k, experts, unsigned(tokens * 31 + experts));
    const slots want = reference_slots(expert, experts, capacity);
    capscope::cuda::device_buffer<int> d_expert(expert.size()), d_counts{std::size_t(experts)}, d_slot(expert.size()),
        d_owner(std::max<std::size_t>(want.row_owner.size(), 1));
    d_expert.copy_from_host(expert, s);
    auto run = [&] {
        // Poison that no valid output equals: every element must be written.
        for (auto* b : {&d_counts, &d_slot, &d_owner}) CAPSCOPE_CHECK(cudaMemsetAsync(b->data(), 0x7f, b->bytes(), s));
        gpt::kernels::assign_slots(d_expert.data(), d_counts.data(), d_slot.data(), d_owner.data(), tokens, k, experts, capacity, s.get());
        return slots{support::download(d_counts.data(), want.counts.size(), s), support::download(d_slot.data(), want.slot.size(), s),
                     support::download(d_owner.data(), want.row_owner.size(), s)};
    };
    const slots got = run();
    CHECK(got.counts == want.counts);
    CHECK(got.slot == want.slot);
    CHECK(got.row_owner == want.row_owner);
    const long dropped = std::count(want.slot.begin(), want.slot.end(), -1);
    std::printf("  slots tokens %-5d k %d experts %-2d capacity %-4d  %ld dropped  %s\n", tokens, k, experts, capacity, dropped,
                got.slot == want.slot && got.row_owner == want.row_owner && got.counts == want.counts ? "exact" : "DIFFERENT");
}

} // namespace

TEST_CASE_TEMPLATE("the chunked scan equals the recurrence in float64, forward and backward, and repeats bit for bit", T, float,
                   __nv_bfloat16, __half) {
    for (int seq : {1, 5, 32, 33, 300, 2048})
        for (int inner : {1, 40, 64}) {
            CAPTURE(seq);
            CAPTURE(inner);
            check_scan<T>({2, seq, inner});
        }
}

TEST_CASE("slot assignment equals the host walk in token order, with drops and padding, and dropless") {
    for (int tokens : {1, 100, 1000, 4100})
        for (int experts : {1, 8, 64}) {
            const int k = std::min(2, experts);
            const int fair = (tokens * k + experts - 1) / experts;
            check_slots(tokens, k, experts, 0);                        // dropless
            check_slots(tokens, k, experts, fair);                     // capacity factor 1: the skew drops some
            check_slots(tokens, k, experts, std::max(1, fair / 4));   // most dropped
            check_slots(tokens, k, experts, tokens * k + 3);           // nothing dropped, most rows padding
        }
}

// ---- the embedding backward: each token's rows, found by ballots, added in row order ----------

//! dtok and dpos against a host walk in row order (float, the kernel's order), bit for bit, with
//! rows past one 256-row chunk and not a multiple of it, widths off the 256-column tile, and tokens
//! repeated within warps and across chunks (`vocab` small).
void check_embedding_backward(int vocab, int batch, int seq, int hidden, std::uint64_t seed) {
    CAPTURE(vocab);
    CAPTURE(seq);
    CAPTURE(hidden);
    const std::size_t rows = std::size_t(batch) * seq;
    std::mt19937 rng{static_cast<unsigned>(seed)};
    std::vector<int> tokens(rows);
    for (int& t : tokens) t = int(rng() % unsigned(vocab));
    const auto dout = random_values<float>(rows * std::size_t(hidden), seed, 1.f);
    std::vector<float> want_tok(std::size_t(vocab) * hidden, 0.f), want_pos(std::size_t(seq) * hidden, 0.f);
    for (std::size_t t = 0; t < rows; ++t)
        for (int h = 0; h < hidden; ++h) want_tok[std::size_t(tokens[t]) * hidden + h] += dout[t * hidden + h];
    for (int p = 0; p < seq; ++p)
        for (int h = 0; h < hidden; ++h) {
            float acc = 0.f;
            for (int b = 0; b < batch; ++b) acc += dout[(std::size_t(b) * seq + p) * hidden + h];
            want_pos[std::size_t(p) * hidden + h] = acc;
        }
    capscope::cuda::stream s;
    capscope::cuda::device_buffer<int> d_tokens(rows);
    capscope::cuda::device_buffer<float> d_dout(dout.size()), d_tok(want_tok.size()), d_pos(want_pos.size());
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_tokens.data(), tokens.data(), d_tokens.bytes(), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_dout.data(), dout.data(), d_dout.bytes(), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemsetAsync(d_tok.data(), 0, d_tok.bytes(), s)); // the kernels accumulate
    CAPSCOPE_CHECK(cudaMemsetAsync(d_pos.data(), 0, d_pos.bytes(), s));
    gpt::kernels::embedding_backward<float>(d_tokens.data(), d_dout.data(), d_tok.data(), d_pos.data(), vocab, seq, batch, seq, hidden, s);
    const auto tok = support::download(d_tok.data(), want_tok.size(), s), pos = support::download(d_pos.data(), want_pos.size(), s);
    const bool same_tok = std::memcmp(tok.data(), want_tok.data(), tok.size() * sizeof(float)) == 0;
    const bool same_pos = std::memcmp(pos.data(), want_pos.data(), pos.size() * sizeof(float)) == 0;
    std::printf("  embedding backward vocab %4d, %d x %4d rows, hidden %4d: token rows summed in row order bit for bit: %s, positions: %s\n",
                vocab, batch, seq, hidden, same_tok ? "yes" : "NO", same_pos ? "yes" : "NO");
    CHECK(same_tok);
    CHECK(same_pos);
}

TEST_CASE("the embedding backward adds each token's rows in row order, bit for bit, past one chunk and off the column tile") {
    check_embedding_backward(7, 2, 500, 300, 1);   // rows 1000: three chunks and a part
    check_embedding_backward(3, 1, 2049, 2048, 2); // every warp holds each token many times
    check_embedding_backward(50, 1, 256, 1, 3);    // one chunk exactly, one column
    check_embedding_backward(1000, 1, 777, 33, 4); // tokens mostly unseen
    check_embedding_backward(1, 1, 5, 257, 5);     // one token, a column tile and one column
}

// Small enough for racecheck (scripts/gpu-check.sh): several stretches and tiles, shared maps.
TEST_CASE("the scan and the slot assignment, a few shapes for the sanitizers") {
    check_scan<__nv_bfloat16>({2, 100, 40});
    check_slots(1500, 2, 8, 300);
    check_slots(1500, 2, 8, 0);
    check_embedding_backward(5, 1, 300, 40, 6);
}
