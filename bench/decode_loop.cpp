// Greedy generation, measured side by side in one process: a whole generation as one graph launch
// (a WHILE node around one decode step) against one graph launch per token, on the example model
// with its KV cache (bf16, hidden 512, 8 layers D E M D D E M D, vocab 4096, prompts of 16 tokens).
// Per batch (1, 4, 16) and generation length (32, 128 tokens), three ways, round-robin:
//   - one graph: inference scope block over generate_program, one launch per generation;
//   - per token: the prompts' graph, then one graph per token, launched back to back;
//   - per token, flag read: the same, reading the loop's flag on the host after each token (what
//     stopping at an end token needs without a device-side loop).
// No end token, so every way makes batch x N tokens; the tokens of all three are compared.
//
//   decode_loop [--rounds R] [--markdown FILE] [--csv FILE]        Exits 77 without a GPU.

#include "arguments.hpp"
#include "figures_csv.hpp"
#include "round_robin.hpp"

#include <gpt/inference.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using T = __nv_bfloat16;
using namespace capscope;
using clock_type = std::chrono::steady_clock;

using moe_facts = model<experts<4>, moe_pattern<0, 1, 0, 0, 0, 1, 0, 0>, capacity_factor<2.0>, pad_to_capacity>;
using block_cfg = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, buckets<1, 4, 16>>;
constexpr int prompt_len = 16;

gpt::model_config bench_model() {
    gpt::model_config c;
    c.vocab = 4096;
    c.hidden = 512;
    c.heads = 8;
    c.ffn_hidden = 2048;
    c.seq_len = 160; // a prompt of 16 and 128 new tokens
    c.batch = 16;
    c.layer_pattern = "DEMDDEMD";
    c.experts = 4;
    c.top_k = 2;
    c.capacity_factor = 2.0; // no token dropped
    c.init_stddev = 0.02f;
    return c;
}

struct way {
    const char* name;
    std::vector<double> ms;      // host wall time of whole generations, synchronized at the end
    std::vector<double> host_ms; // of which the host spent enqueueing (until the final synchronize)
    std::vector<int> tokens;
};

} // namespace

int main(int argc, char** argv) {
    int rounds = 5;
    std::string markdown, csv;
    bench::arguments("decode_loop").integer("--rounds", rounds, 1).text("--markdown", markdown).text("--csv", csv).parse_or_exit(argc, argv);
    const std::string gpu = bench::device_or_skip();
    cuda::stream s;
    gpt::inference_model<T> m(bench_model(), s.get());
    const gpt::model_config& c = m.config();
    std::printf("%s; bf16 h%d, %zu layers %s, vocab %d, prompts of %d tokens; %d rounds, round-robin; host wall time per generation\n",
                gpu.c_str(), c.hidden, c.layer_pattern.size(), c.layer_pattern.c_str(), c.vocab, prompt_len, rounds);
    const std::vector<int> bucket{1, 4, 16};
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int> tok(0, c.vocab - 1);
    std::vector<int> prompts(std::size_t(c.batch) * prompt_len);
    for (int& t : prompts) t = tok(rng);

    std::string md = "| batch | tokens per sequence | one graph (ms) | per token (ms) | per token, flag read (ms) | one graph, tokens/s | per token, "
                     "tokens/s | per token / one graph | flag read / one graph | host enqueue, one graph (ms) | host enqueue, per token (ms) | same "
                     "tokens |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    bench::figures_csv figures(csv);
    for (int n_new : {32, 128}) {
        const gpt::generation g{prompt_len, n_new, -1};
        inference_runner<block_cfg> whole(m.generate_program(bucket, g));
        inference_runner<block_cfg> prefill(m.prefill_program(bucket, g)), step(m.decode_step_program(bucket, g));
        for (int batch : {1, 4, 16}) {
            const std::span<const int> mine(prompts.data(), std::size_t(batch) * prompt_len);
            way ways[3] = {{"one graph", {}, {}, {}}, {"per token", {}, {}, {}}, {"per token, flag read", {}, {}, {}}};
            double enqueued = 0;
            auto run = [&](int which) {
                m.set_prompts(mine, batch, batch, prompt_len, s.get());
                CAPSCOPE_CHECK(cudaStreamSynchronize(s.get()));
                const auto t0 = clock_type::now();
                if (which == 0) {
                    whole.run(whole.choose(batch), s.get());
                } else {
                    prefill.run(prefill.choose(batch), s.get());
                    int more = 1;
                    for (int i = 1; i < n_new; ++i) {
                        if (which == 2) {
                            CAPSCOPE_CHECK(cudaMemcpyAsync(&more, m.decoding(), sizeof(int), cudaMemcpyDeviceToHost, s.get()));
                            CAPSCOPE_CHECK(cudaStreamSynchronize(s.get()));
                            if (!more) break;
                        }
                        step.run(step.choose(batch), s.get());
                    }
                }
                enqueued = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
                CAPSCOPE_CHECK(cudaStreamSynchronize(s.get()));
                return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
            };
            for (int w = 0; w < 3; ++w) // warmup (eager) and capture
                for (int k = 0; k < 2; ++k) run(w);
            for (int r = 0; r < rounds; ++r)
                for (int w = 0; w < 3; ++w) {
                    ways[w].ms.push_back(run(w));
                    ways[w].host_ms.push_back(enqueued);
                    if (r == 0) ways[w].tokens = m.copy_generated(batch, g, s.get());
                }
            const bool same = ways[0].tokens == ways[1].tokens && ways[0].tokens == ways[2].tokens;
            const double one = bench::median(ways[0].ms), per = bench::median(ways[1].ms), read = bench::median(ways[2].ms);
            const double made = double(batch) * n_new;
            const double host_one = bench::median(ways[0].host_ms), host_per = bench::median(ways[1].host_ms);
            std::printf("batch %2d, %3d tokens: one graph %8.3f ms (%9.0f tokens/s, host enqueue %.3f ms); per token %8.3f ms (%9.0f tokens/s, "
                        "host enqueue %.3f ms); per token with the flag read %8.3f ms; per token / one graph %.3fx (flag read %.3fx); the same "
                        "tokens: %s\n",
                        batch, n_new, one, made / one * 1e3, host_one, per, made / per * 1e3, host_per, read, per / one, read / one,
                        same ? "yes" : "NO");
            char row[512];
            std::snprintf(row, sizeof row, "| %d | %d | %.3f | %.3f | %.3f | %.0f | %.0f | %.3fx | %.3fx | %.3f | %.3f | %s |\n", batch, n_new,
                          one, per, read, made / one * 1e3, made / per * 1e3, per / one, read / one, host_one, host_per, same ? "yes" : "NO");
            md += row;
            const std::string kase = "batch " + std::to_string(batch) + ", " + std::to_string(n_new) + " tokens";
            figures.row("decode loop", kase, "one graph", "ms", one);
            figures.row("decode loop", kase, "per token", "ms", per);
            figures.row("decode loop", kase, "per token, flag read", "ms", read);
            figures.row("decode loop", kase, "one graph", "host_enqueue_ms", host_one);
            figures.row("decode loop", kase, "per token", "host_enqueue_ms", host_per);
            if (!same) return 1;
        }
    }
    std::printf("\n%s", md.c_str());
    if (!markdown.empty()) std::ofstream(markdown) << md;
    return 0;
}
