// The fused attention kernels alone, at the model's shapes: the forward and the backward of one
// layer's causal attention (bf16), timed round-robin in one process, with the useful work rate
// (the FLOPs of the matmuls attention needs, not the ones a kernel repeats). bench/peers/
// attention_peer.py times PyTorch's scaled_dot_product_attention (cuDNN and FlashAttention-2) on
// the same shape; bench/attention.sh runs both, so the ratio comes from one run.
//
//   attention [--batch B] [--seq S] [--heads N] [--head-dim D (a multiple of 8, <= 128)] [--rounds R]
//
// It also prints a hash of the output, the log-sum-exp and the gradient: a kernel change that
// should not change the arithmetic (a load, a register bound) must leave it as it was.

#include "arguments.hpp"
#include "kernels.hpp"
#include "round_robin.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/stream.hpp>

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

struct variant {
    const char* name;
    std::function<void(cudaStream_t)> run;
    std::vector<float> device_ms, host_us;
    void step(cudaStream_t s) { run(s); }
};

//! The shape and the rounds; a missing or malformed value, or an unknown option, ends the program
//! with a message and exit code 2.
struct options {
    int batch = 1, seq = 2048, heads = 32, head_dim = 64, rounds = 20;
};

options parse(int argc, char** argv) {
    options o;
    const bench::arguments args = bench::arguments("attention")
                                      .integer("--batch", o.batch, 1)
                                      .integer("--seq", o.seq, 1)
                                      .integer("--heads", o.heads, 1)
                                      .integer("--head-dim", o.head_dim, 8, 128)
                                      .integer("--rounds", o.rounds, 1);
    args.parse_or_exit(argc, argv);
    // The bench times the tensor-core kernels; other widths take the scalar path.
    if (o.head_dim % 8 != 0)
        args.refuse("--head-dim " + std::to_string(o.head_dim) + " is not a tensor-core width: give a multiple of 8 up to 128");
    return o;
}

} // namespace

int main(int argc, char** argv) {
    const options opt = parse(argc, argv);
    const int batch = opt.batch, seq = opt.seq, heads = opt.heads, dh = opt.head_dim, rounds = opt.rounds;
    const std::string gpu = bench::device_or_skip();
    using E = __nv_bfloat16;
    const long rows = long(batch) * seq, H = long(heads) * dh;
    capscope::cuda::stream s;
    capscope::cuda::device_buffer<E> qkv(std::size_t(rows * 3 * H)), out(std::size_t(rows * H)), dout(std::size_t(rows * H)),
        dqkv(std::size_t(rows * 3 * H));
    capscope::cuda::device_buffer<float> lse(std::size_t(rows * heads)), rowdot(std::size_t(rows * heads));
    {
        std::mt19937 gen(5);
        std::normal_distribution<float> dist(0.f, 1.f);
        std::vector<E> host(std::size_t(rows * 3 * H));
        for (E& x : host) x = E(dist(gen));
        CAPSCOPE_CHECK(cudaMemcpyAsync(qkv.data(), host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice, s));
        host.resize(std::size_t(rows * H));
        for (E& x : host) x = E(dist(gen));
        CAPSCOPE_CHECK(cudaMemcpyAsync(dout.data(), host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice, s));
    }
    using gpt::kernels::attention_mask;
    auto forward = [&](cudaStream_t st) {
        gpt::kernels::flash_attention_forward(qkv.data(), out.data(), lse.data(), attention_mask::causal, nullptr, batch, seq, heads, dh, st);
    };
    auto backward = [&](cudaStream_t st) {
        gpt::kernels::flash_attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), rowdot.data(), dqkv.data(),
                                               attention_mask::causal, nullptr, batch, seq, heads, dh, st);
    };
    forward(s); // the backward reads the forward's output and log-sum-exp
    std::vector<variant> variants{{"forward", forward, {}, {}}, {"backward", backward, {}, {}}};
    bench::time_round_robin(variants, 2, 5, s); // warm-up
    for (auto& v : variants) v.device_ms.clear(), v.host_us.clear();
    bench::time_round_robin(variants, rounds, 10, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));

    // Causal: half of the S x S scores. The forward's matmuls are Q K^T and P V; the backward's are
    // Q K^T (recomputed), dO V^T, dV = P^T dO, dK = dS^T Q and dQ = dS K: 2.5 times the forward's.
    const double forward_flop = 2.0 * 2.0 * double(batch) * heads * double(seq) * seq * dh / 2.0;
    std::printf("attention, causal, bf16, b%d s%d heads %d head_dim %d on %s (median of %d launches each, round-robin)\n", batch, seq,
                heads, dh, gpu.c_str(), rounds * 10);
    for (auto& v : variants) {
        const double ms = bench::median(v.device_ms), flop = forward_flop * (v.name == std::string("forward") ? 1.0 : 2.5);
        std::printf("capscope %-9s %8.1f us  %6.1f TFLOP/s useful\n", v.name, ms * 1e3, flop / (ms * 1e-3) / 1e12);
    }
    std::uint64_t hash = 14695981039346656037ull; // FNV-1a over the bytes
    auto fold = [&](const auto& buffer) {
        std::vector<unsigned char> bytes(buffer.bytes());
        CAPSCOPE_CHECK(cudaMemcpyAsync(bytes.data(), buffer.data(), bytes.size(), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    };
    fold(out), fold(lse), fold(dqkv);
    std::printf("capscope bits      %016llx (hash of the output, log-sum-exp and gradient)\n", static_cast<unsigned long long>(hash));
    return 0;
}
