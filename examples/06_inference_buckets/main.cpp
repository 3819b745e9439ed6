// Tutorial 06: serving with inference graphs in batch-size buckets.
//
// A model learns the reverse task (graphed training, as in tutorial 03), then serves requests of
// 1 to 12 sequences. The serving side is a forward-only copy of the model (no gradients, no
// optimizer state) and two inference runners over the same buckets {1, 2, 4, 8}:
//
// - scope layer (Megatron `--inference-cuda-graph-scope layer`): one graph per layer, the
//   embedding and the head eager;
// - scope block (`block`): the whole forward, embedding to logits, as one graph.
//
// A request of n sequences runs in the smallest bucket >= n, padded with masked rows; a request
// past the largest bucket runs eagerly (the config says `oversize_requests<run_eagerly>`). The
// two scopes run the same kernels in the same order, so their logits are bitwise equal.
//
//   06_inference_buckets        Exits 1 unless the served answers are right, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/inference.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cstring>

using namespace capscope;
using T = __nv_bfloat16;

using moe_facts = model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<1.5>, pad_to_capacity>;
using training = config<impl::lazy_per_layer, modules<capture::attention, capture::mlp, capture::moe>, moe_facts>;
// [snippet configs]
using sizes = buckets<1, 2, 4, 8>;
using serve_layers = config<impl::lazy_per_layer, inference::per_layer, moe_facts, warmup_steps<1>, sizes,
                            oversize_requests<oversize::run_eagerly>>;
using serve_block = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, sizes,
                           oversize_requests<oversize::run_eagerly>>;
// [snippet configs]

//! n reverse-task sequences (symbols, separator, the symbols reversed), and the 8 answers per
//! sequence: position symbols + i predicts the (i+1)-th symbol of the reversed half.
std::vector<int> requests(int n, std::mt19937& rng, std::vector<int>& answers) {
    std::uniform_int_distribution<int> sym(tutorial::first_symbol, tutorial::first_symbol + 13);
    std::vector<int> tokens;
    answers.clear();
    for (int r = 0; r < n; ++r) {
        std::vector<int> seq(tutorial::symbols);
        for (int& x : seq) x = sym(rng);
        tokens.insert(tokens.end(), seq.begin(), seq.end());
        tokens.push_back(tutorial::separator);
        tokens.insert(tokens.end(), seq.rbegin(), seq.rend() - 1); // 16 positions: the last symbol is only predicted
        answers.insert(answers.end(), seq.rbegin(), seq.rend());
    }
    return tokens;
}

int main() {
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        // 1. Train (graphed per layer) until the model reverses.
        gpt::model_config cfg = tutorial::reverse_task_model("DEMD", 128, 16, 1);
        gpt::gpt_model<T> trained(cfg, s);
        runner<training> train(trained.training_program());
        std::mt19937 rng(5);
        trained.set_optimizer({3e-3f}, s);
        for (int step = 0; step < 300; ++step) {
            tutorial::feed(trained, rng, s);
            train.step(s);
        }
        std::printf("trained 300 steps, loss %.4f\n", trained.loss(s));

        // [snippet serve]
        // 2. Serve: a forward-only model with capacity 16 sequences, loaded with the weights.
        cfg.batch = 16;
        gpt::inference_model<T> served(cfg, s);
        served.load_parameters(trained, s);
        inference_runner<serve_layers> by_layer(served.inference_program(serve_layers::engine.batch_buckets.view()));
        inference_runner<serve_block> by_block(served.inference_program(serve_block::engine.batch_buckets.view()));
        std::fputs(by_layer.plan_text().c_str(), stdout);
        std::fputs(by_block.plan_text().c_str(), stdout);
        // [snippet serve]

        const std::size_t row = std::size_t(cfg.seq_len) * cfg.vocab;
        int right = 0, asked = 0;
        bool scopes_agree = true;
        for (int n : {1, 3, 8, 2, 5, 12, 4, 7, 1, 6}) {
            std::vector<int> answers;
            const auto tokens = requests(n, rng, answers);
            // [snippet request]
            const bucket_choice c = by_layer.choose(n);
            served.set_request(tokens, n, c.eager() ? n : c.size, s);
            by_layer.run(c, s);
            const auto layer_logits = served.copy_logits(n, s);
            by_block.run(by_block.choose(n), s);
            const auto block_logits = served.copy_logits(n, s);
            scopes_agree &= std::memcmp(layer_logits.data(), block_logits.data(), layer_logits.size() * sizeof(float)) == 0;
            // [snippet request]
            int ok = 0;
            for (int r = 0; r < n; ++r)
                for (int i = 0; i < tutorial::symbols; ++i) { // argmax at the separator and after
                    const float* l = block_logits.data() + std::size_t(r) * row + std::size_t(tutorial::symbols + i) * cfg.vocab;
                    ok += int(std::max_element(l, l + cfg.vocab) - l) == answers[std::size_t(r * tutorial::symbols + i)];
                }
            right += ok;
            asked += n * tutorial::symbols;
            if (c.eager()) std::printf("request of %2d sequences: past the largest bucket, ran eagerly at %d; %d/%d symbols right\n", n, n, ok, n * tutorial::symbols);
            else std::printf("request of %2d sequences: bucket %d (%d padded), %d/%d symbols right\n", n, c.size, c.padded(), ok, n * tutorial::symbols);
        }
        const runner_counters& kl = by_layer.counters();
        const runner_counters& kb = by_block.counters();
        std::printf("scope layer: %ld forwards, %ld captures, %ld replays, %ld eager islands run, %ld past the largest bucket\n", kl.steps,
                    kl.captures, kl.replays, kl.eager_segment_runs, kl.oversize_runs);
        std::printf("scope block: %ld forwards, %ld captures, %ld replays, %ld eager islands run, %ld past the largest bucket\n", kb.steps,
                    kb.captures, kb.replays, kb.eager_segment_runs, kb.oversize_runs);
        std::printf("layer and block logits bitwise equal: %s\n", scopes_agree ? "yes" : "NO");
        std::printf("symbols right: %d of %d\n", right, asked);
        return scopes_agree && right * 10 >= asked * 9 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "06_inference_buckets: %s\n", e.what());
        return 1;
    }
}
