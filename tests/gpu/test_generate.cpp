// Greedy generation with a KV cache: a whole generation as one graph (a WHILE node around one
// decode step), bit for bit equal to the same loop run eagerly (the flag read on the host after
// each pass) and to a loop that launches one graph per token; every token equal to the greedy
// choice of the full forward over the same sequence (fp32), and the last step's logits close to
// it; the end token ends a sequence and, once every real one has ended, the loop; and the rules
// that refuse what cannot work (a loop split over per-layer graphs, P16; dropless MoE in the
// loop, P14; positions past seq_len).

#include "support.hpp"

#include <gpt/inference.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace capscope;

namespace {

using moe_facts = model<experts<4>, moe_pattern<0, 1, 0>, capacity_factor<2.0>, pad_to_capacity>;
using sizes = buckets<1, 2, 4>;
using block_cfg = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, sizes>;
using eager_cfg = config<impl::eager, inference::eager, moe_facts, warmup_steps<1>, sizes>;
using layer_cfg = config<impl::lazy_per_layer, inference::per_layer, moe_facts, warmup_steps<1>, sizes>;

//! "DEM" (dense, attention + MoE with room for every token, Mamba-style), 4 sequences of 16.
gpt::model_config decoder(gpt::moe_mode mode = gpt::moe_mode::drop_and_pad) {
    gpt::model_config c = support::small_model("DEM", mode, 2.0);
    c.seed = 11;
    return c;
}

std::vector<int> random_prompts(int n, int len, int vocab, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    std::vector<int> t(std::size_t(n) * std::size_t(len));
    for (int& x : t) x = tok(rng);
    return t;
}

struct outcome {
    std::vector<int> tokens;
    runner_counters counters;
};

//! The whole generation through one runner of `program` (its first run is the eager warmup, so
//! each generation runs twice: the second is the one checked).
template <class Config, class T>
outcome generate_once(gpt::inference_model<T>& m, const inference_program& program, const std::vector<int>& prompts, int n, int rows,
                      const gpt::generation& g, cudaStream_t s) {
    inference_runner<Config> r(program);
    for (int round = 0; round < 2; ++round) {
        m.set_prompts(prompts, n, rows, g.prompt_len, s);
        r.run(r.choose(rows), s);
    }
    return {m.copy_generated(n, g, s), r.counters()};
}

//! One graph launch per token: the prompts' forward and the first token, then a step at a time
//! while the flag (copied to the host after each) says another token is due; then `extra` steps
//! more, past the last, which must change nothing (and touch no memory out of bounds: memcheck).
template <class T>
outcome generate_per_token(gpt::inference_model<T>& m, const std::vector<int>& prompts, int n, int rows, const gpt::generation& g,
                           cudaStream_t s, int* launches, int extra = 2) {
    const std::vector<int> bucket{1, 2, 4};
    inference_runner<block_cfg> prefill(m.prefill_program(bucket, g)), step(m.decode_step_program(bucket, g));
    int more = 0;
    for (int round = 0; round < 2; ++round) {
        *launches = 0;
        m.set_prompts(prompts, n, rows, g.prompt_len, s);
        prefill.run(prefill.choose(rows), s);
        ++*launches;
        for (;;) {
            CAPSCOPE_CHECK(cudaMemcpyAsync(&more, m.decoding(), sizeof(int), cudaMemcpyDeviceToHost, s));
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            if (!more) break;
            step.run(step.choose(rows), s);
            ++*launches;
        }
    }
    for (int i = 0; i < extra; ++i) step.run(step.choose(rows), s);
    return {m.copy_generated(n, g, s), step.counters()};
}

std::string row_text(const std::vector<int>& t, int row, int len) {
    std::string out;
    for (int i = 0; i < len; ++i) out += (i ? " " : "") + std::to_string(t[std::size_t(row) * len + i]);
    return out;
}

template <class T> void check_generation(int n, int rows, gpt::generation g) {
    CAPTURE(n);
    CAPTURE(rows);
    CAPTURE(g.end_token);
    cuda::stream s;
    gpt::inference_model<T> m(decoder(), s.get());
    const std::vector<int> bucket{1, 2, 4};
    const auto prompts = random_prompts(n, g.prompt_len, m.config().vocab, 5 + std::uint64_t(n));
    const outcome graph = generate_once<block_cfg>(m, m.generate_program(bucket, g), prompts, n, rows, g, s.get());
    const outcome eager = generate_once<eager_cfg>(m, m.generate_program(bucket, g), prompts, n, rows, g, s.get());
    int launches = 0;
    const outcome per_token = generate_per_token(m, prompts, n, rows, g, s.get(), &launches);
    std::printf("  %s n %d bucket %d prompt %d max_new %d end %d: one graph (%ld replays, %ld conditional nodes) / eager (%ld host reads "
                "of the flag) / %d launches, one per token: %s\n    row 0: %s\n",
                support::precision_name<T>, n, rows, g.prompt_len, g.max_new, g.end_token, graph.counters.replays,
                graph.counters.conditional_nodes, eager.counters.guard_reads, launches,
                graph.tokens == eager.tokens && graph.tokens == per_token.tokens ? "the same tokens" : "DIFFERENT",
                row_text(graph.tokens, 0, g.max_new).c_str());
    CHECK(graph.counters.conditional_nodes == 1);
    CHECK(graph.counters.replays == 1); // the second generation: one launch
    CHECK(eager.counters.guard_reads > 0);
    CHECK(graph.tokens == eager.tokens);
    CHECK(graph.tokens == per_token.tokens);
    // Each row: once the end token is out, only the end token follows.
    for (int b = 0; b < n; ++b) {
        bool ended = false;
        for (int i = 0; i < g.max_new; ++i) {
            const int t = graph.tokens[std::size_t(b) * g.max_new + i];
            if (ended) CHECK(t == g.end_token);
            ended = ended || (g.end_token >= 0 && t == g.end_token);
        }
    }
}

//! fp32: every generated token is the greedy choice of the full forward over the prompt and the
//! tokens before it (all positions at once, the flash attention; no cache), and the last step's
//! logits are close to that forward's at the same position.
void check_against_full_forward(int n) {
    cuda::stream s;
    gpt::inference_model<float> m(decoder(), s.get());
    const gpt::model_config& c = m.config();
    const gpt::generation g{5, 10, -1};
    const std::vector<int> bucket{1, 2, 4};
    const auto prompts = random_prompts(n, g.prompt_len, c.vocab, 77);
    const outcome graph = generate_once<block_cfg>(m, m.generate_program(bucket, g), prompts, n, n, g, s.get());
    const auto last = support::download(m.logits(), std::size_t(n) * c.vocab, s.get()); // the last decode step's rows
    std::vector<int> full(std::size_t(n) * c.seq_len, 0);
    for (int b = 0; b < n; ++b) {
        for (int i = 0; i < g.prompt_len; ++i) full[std::size_t(b) * c.seq_len + i] = prompts[std::size_t(b) * g.prompt_len + i];
        for (int i = 0; i + 1 < g.max_new; ++i) full[std::size_t(b) * c.seq_len + g.prompt_len + i] = graph.tokens[std::size_t(b) * g.max_new + i];
    }
    m.set_request(full, n, n, s.get());
    m.forward(n, s.get());
    const auto logits = support::download(m.logits(), std::size_t(n) * c.seq_len * c.vocab, s.get());
    int agree = 0;
    double num = 0, den = 0;
    for (int b = 0; b < n; ++b)
        for (int i = 0; i < g.max_new; ++i) {
            const float* row = logits.data() + (std::size_t(b) * c.seq_len + g.prompt_len - 1 + i) * c.vocab;
            agree += int(std::max_element(row, row + c.vocab) - row) == graph.tokens[std::size_t(b) * g.max_new + i];
            if (i + 1 == g.max_new)
                for (int v = 0; v < c.vocab; ++v) {
                    const double d = double(last[std::size_t(b) * c.vocab + v]) - row[v];
                    num += d * d, den += double(row[v]) * row[v];
                }
        }
    const double err = std::sqrt(num / den);
    std::printf("  fp32, %d sequences: %d of %d tokens are the full forward's greedy choice; the last step's logits within %.1e of its\n", n,
                agree, n * g.max_new, err);
    CHECK(agree == n * g.max_new);
    CHECK(err < 1e-4);
}

} // namespace

TEST_CASE("a whole generation in one graph: the KV cache agrees with the full forward (fp32)") {
    check_against_full_forward(1);
    check_against_full_forward(4);
}

TEST_CASE_TEMPLATE("a whole generation in one graph equals the eager loop and one launch per token, bit for bit", T, float, __nv_bfloat16) {
    check_generation<T>(1, 1, {5, 8, -1});
    check_generation<T>(3, 4, {3, 12, -1}); // a padded row in the bucket: it never keeps the loop going
    check_generation<T>(4, 4, {1, 16, -1}); // the longest: every position of the model
    // With an end token: the one that sequence 0 emits third, so it ends early.
    cuda::stream s;
    gpt::inference_model<T> m(decoder(), s.get());
    const gpt::generation probe{4, 10, -1};
    const auto prompts = random_prompts(2, probe.prompt_len, m.config().vocab, 7);
    const std::vector<int> bucket{1, 2, 4};
    const outcome first = generate_once<block_cfg>(m, m.generate_program(bucket, probe), prompts, 2, 2, probe, s.get());
    check_generation<T>(2, 2, {4, 10, first.tokens[2]});
}

TEST_CASE("the end token stops the loop early once every real sequence has emitted it") {
    cuda::stream s;
    gpt::inference_model<float> m(decoder(), s.get());
    const std::vector<int> bucket{1, 2, 4};
    const gpt::generation probe{4, 12, -1};
    const auto prompts = random_prompts(1, probe.prompt_len, m.config().vocab, 3);
    const outcome first = generate_once<block_cfg>(m, m.generate_program(bucket, probe), prompts, 1, 1, probe, s.get());
    const int end = first.tokens[3];
    const int ends_at = int(std::find(first.tokens.begin(), first.tokens.end(), end) - first.tokens.begin()); // the first time it appears
    const gpt::generation g{4, 12, end};
    int launches = 0;
    const outcome per_token = generate_per_token(m, prompts, 1, 1, g, s.get(), &launches);
    std::printf("  end token %d first out at step %d: %d launches of the per-token loop for %d allowed tokens\n", end, ends_at, launches,
                g.max_new);
    CHECK(launches == ends_at + 1);
    const outcome eager = generate_once<eager_cfg>(m, m.generate_program(bucket, g), prompts, 1, 1, g, s.get());
    CHECK(eager.tokens == per_token.tokens);
    CHECK(m.tokens_made(s.get()) == ends_at + 1);
    // The WHILE node stops there too: a loop that ignored the flag would write the same tokens
    // (the end token again), but its step count would reach max_new.
    const outcome graph = generate_once<block_cfg>(m, m.generate_program(bucket, g), prompts, 1, 1, g, s.get());
    CHECK(graph.tokens == per_token.tokens);
    CHECK(graph.counters.conditional_nodes == 1);
    CHECK(m.tokens_made(s.get()) == ends_at + 1);
    // Passes of the WHILE run, read on the host: one read per pass, one at its end; two generations.
    CHECK(eager.counters.guard_reads == 2 * (ends_at + 1));
}

TEST_CASE("what cannot work is refused: a loop over per-layer graphs (P16), dropless MoE in the loop (P14), positions past seq_len") {
    cuda::stream s;
    const std::vector<int> bucket{1, 2, 4};
    gpt::inference_model<float> m(decoder(), s.get());
    try {
        inference_runner<layer_cfg> r(m.generate_program(bucket, {4, 8, -1}));
        FAIL("a WHILE run split over per-layer graphs was accepted");
    } catch (const plan_error& e) {
        std::printf("  %s\n", e.what());
        CHECK(e.rule() == std::string("P16"));
    }
    gpt::inference_model<float> dropless(decoder(gpt::moe_mode::dropless), s.get());
    try {
        // Eager scope, so that the prompts' forward may sync (P1 refuses that under scope block).
        inference_runner<eager_cfg> r(dropless.generate_program(bucket, {4, 8, -1}));
        FAIL("a decode loop that reads expert counts on the host was accepted");
    } catch (const plan_error& e) {
        std::printf("  %s\n", e.what());
        CHECK(e.rule() == std::string("P14"));
        CHECK(e.stage() == "layer1.moe.decode");
    }
    CHECK_THROWS_WITH_AS(m.generate_program(bucket, {8, 10, -1}),
                         "generation: a prompt of 8 tokens and 10 new ones need 17 positions; the model has seq_len 16 (need prompt_len >= 1, "
                         "max_new >= 1, prompt_len + max_new - 1 <= seq_len)",
                         std::out_of_range);
    CHECK_THROWS_AS(m.generate_program(bucket, {4, 8, 32}), std::out_of_range); // end token past the vocabulary
    CHECK_THROWS_AS(m.set_prompts(std::vector<int>(7, 0), 2, 2, 4, s.get()), std::invalid_argument);
}

// For racecheck (scripts/gpu-check.sh): the decode kernels eagerly and as plain graphs, one per
// token. Under CUDA 13.0's racecheck the cases with a conditional node crashed on the host (SIGSEGV);
// memcheck runs them all.
TEST_CASE("generation, eagerly and one graph per token, for the sanitizers") {
    cuda::stream s;
    gpt::inference_model<__nv_bfloat16> m(decoder(), s.get());
    const std::vector<int> bucket{1, 2, 4};
    const gpt::generation g{4, 6, -1};
    const auto prompts = random_prompts(3, g.prompt_len, m.config().vocab, 9);
    const outcome eager = generate_once<eager_cfg>(m, m.generate_program(bucket, g), prompts, 3, 4, g, s.get());
    int launches = 0;
    const outcome per_token = generate_per_token(m, prompts, 3, 4, g, s.get(), &launches);
    CHECK(eager.tokens == per_token.tokens);
    CHECK(launches == g.max_new);
}
