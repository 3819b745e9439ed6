// RMSNorm forward and backward, white-box, against float64: row widths that take the warp-per-row
// forward (whole 16-byte packs, 1 to 16 packs a lane) and ones that take the block-per-row one (a
// width off the pack, a misaligned row, a row too wide); the backward (block per row), with and
// without the residual gradient; each repeated bit for bit.

#include "kernels.hpp"
#include "support.hpp"

#include <capscope/cuda.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using support::as_double;
using support::random_values;
using support::relative_error;

//! `offset` elements into each buffer: 0 keeps rows on 16 bytes, 1 moves every address off them.
template <class T> void check_norm(int rows, int cols, bool residual, int offset) {
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(residual);
    CAPTURE(offset);
    capscope::cuda::stream s;
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = random_values<T>(n, 3 + unsigned(cols), 1.f), dy = random_values<T>(n, 5 + unsigned(rows), 1.f),
               res = random_values<T>(n, 9, 0.5f);
    const auto g = random_values<T>(std::size_t(cols), 7, 0.2f, 1.f);
    const std::size_t o = std::size_t(offset);
    capscope::cuda::device_buffer<T> d_x(n + o), d_dy(n + o), d_res(n + o), d_g(std::size_t(cols) + o), d_y(n + o), d_dx(n + o);
    capscope::cuda::device_buffer<float> d_rstd{std::size_t(rows)};
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_x.data() + o, x.data(), n * sizeof(T), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_dy.data() + o, dy.data(), n * sizeof(T), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_res.data() + o, res.data(), n * sizeof(T), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(d_g.data() + o, g.data(), std::size_t(cols) * sizeof(T), cudaMemcpyHostToDevice, s));
    auto run = [&] {
        CAPSCOPE_CHECK(cudaMemsetAsync(d_y.data(), 0xff, d_y.bytes(), s)); // every element must be written
        CAPSCOPE_CHECK(cudaMemsetAsync(d_dx.data(), 0xff, d_dx.bytes(), s));
        gpt::kernels::rms_norm_forward(d_x.data() + o, d_g.data() + o, d_y.data() + o, d_rstd.data(), rows, cols, s.get());
        gpt::kernels::rms_norm_backward(d_x.data() + o, d_g.data() + o, d_rstd.data(), d_dy.data() + o, residual ? d_res.data() + o : nullptr,
                                        d_dx.data() + o, rows, cols, s.get());
        return std::pair{support::download(d_y.data() + o, n, s), support::download(d_dx.data() + o, n, s)};
    };
    const auto [y, dx] = run();
    // float64: y = x r g, r = 1/sqrt(mean(x^2) + eps); dx = r g dy - x r^3 mean(dy g x) (+ residual)
    std::vector<double> want_y(n), want_dx(n);
    const auto X = as_double(x), DY = as_double(dy), R = as_double(res), G = as_double(g);
    for (int i = 0; i < rows; ++i) {
        double ss = 0, dot = 0;
        for (int c = 0; c < cols; ++c) {
            const std::size_t k = std::size_t(i) * cols + c;
            ss += X[k] * X[k];
            dot += DY[k] * G[std::size_t(c)] * X[k];
        }
        const double r = 1.0 / std::sqrt(ss / cols + 1e-5);
        for (int c = 0; c < cols; ++c) {
            const std::size_t k = std::size_t(i) * cols + c;
            want_y[k] = X[k] * r * G[std::size_t(c)];
            want_dx[k] = r * G[std::size_t(c)] * DY[k] - X[k] * r * r * r * dot / cols + (residual ? R[k] : 0.0);
        }
    }
    const double bound = std::is_same_v<T, float> ? 1e-5 : 1e-2;
    const double e_y = relative_error(as_double(y), want_y), e_dx = relative_error(as_double(dx), want_dx);
    std::printf("  norm %s rows %-3d cols %-5d residual %d offset %d: rel. L2 y %.1e dx %.1e (bound %.0e)\n", support::precision_name<T>, rows,
                cols, int(residual), offset, e_y, e_dx, bound);
    CHECK(e_y < bound);
    CHECK(e_dx < bound);
    const auto [y2, dx2] = run();
    CHECK(std::memcmp(y.data(), y2.data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(dx.data(), dx2.data(), n * sizeof(T)) == 0);
}

} // namespace

TEST_CASE_TEMPLATE("RMSNorm equals float64 on both forward kernels (warp per row, block per row) and the backward, and repeats bit for bit", T, float,
                   __nv_bfloat16, __half) {
    for (int rows : {1, 7, 33})
        for (int cols : {12, 16, 64, 520, 2048, 4096, 5000}) // 12 and 5000: block per row (off the pack; too wide for bf16 and fp32)
            for (bool residual : {false, true}) check_norm<T>(rows, cols, residual, 0);
    check_norm<T>(5, 64, true, 1); // every address off 16 bytes: block per row
}

// Small enough for racecheck (scripts/gpu-check.sh): both kernels.
TEST_CASE("RMSNorm, a few shapes for the sanitizers") {
    check_norm<__nv_bfloat16>(9, 2048, true, 0);
    check_norm<__nv_bfloat16>(9, 12, true, 0);
}
