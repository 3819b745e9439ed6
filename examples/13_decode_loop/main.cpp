// Tutorial 13: a decode loop in one graph.
//
// Train the model of tutorial 06 to reverse 8 symbols, then let it write the reversed half itself:
// each prompt is 8 symbols and the separator, and greedy decoding with a KV cache makes the next
// 8 tokens, one position at a time. The whole generation, the prompts' forward and every decode
// step, is one graph launch: the decode step sits in a WHILE node whose flag a kernel clears
// once every sequence has emitted its end token or the length is reached. The same program runs
// eagerly (the runner reads the flag on the host before each pass and after the last) and as one
// graph per token; the three make the same tokens, bit for bit.
//
//   13_decode_loop
//
// Prints the plan, the generated tokens beside the answers, and the launches each way took;
// exits 1 unless the three agree and most symbols come out right, 77 without a GPU.

#include "../common/tutorial.hpp"

#include <gpt/inference.hpp>
#include <gpt/model.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

using namespace capscope;
using T = __nv_bfloat16;

using moe_facts = model<experts<4>, moe_pattern<0, 1, 0, 0>, capacity_factor<1.5>, pad_to_capacity>;
using training = config<impl::lazy_per_layer, modules<capture::attention, capture::mlp, capture::moe>, moe_facts>;
using sizes = buckets<1, 4, 16>;
using serve_block = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, sizes>;
using serve_eager = config<impl::eager, inference::eager, moe_facts, sizes>;

int main(int argc, char**) {
    if (argc > 1) {
        std::fputs("usage: 13_decode_loop (no arguments)\n", stderr);
        return 2;
    }
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        // 1. Train until the model reverses (as in tutorial 06).
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

        // 2. A forward-only model with the weights. Decoding runs one position of 4 sequences at
        //    a time, so a capacity of 1.5x would leave each expert 3 slots for 8 assignments:
        //    capacity factor 2 (experts / top-k) drops none. It changes no weight.
        cfg.capacity_factor = 2.0;
        gpt::inference_model<T> served(cfg, s);
        served.load_parameters(trained, s);

        // [snippet generation]
        // 3. Prompts: 8 symbols and the separator; 8 tokens to generate, no end token (the
        //    reversed half is always 8 long). Positions used: 9 + 8 - 1 = 16 = seq_len.
        const int n = 4;
        const gpt::generation g{tutorial::symbols + 1, tutorial::symbols, -1};
        // [snippet generation]
        std::uniform_int_distribution<int> sym(tutorial::first_symbol, tutorial::first_symbol + 13);
        std::vector<int> prompts, answers;
        for (int r = 0; r < n; ++r) {
            std::vector<int> seq(tutorial::symbols);
            for (int& x : seq) x = sym(rng);
            prompts.insert(prompts.end(), seq.begin(), seq.end());
            prompts.push_back(tutorial::separator);
            answers.insert(answers.end(), seq.rbegin(), seq.rend());
        }
        // [snippet one_graph]
        const std::vector<int> bucket_list{1, 4, 16};
        inference_runner<serve_block> one_graph(served.generate_program(bucket_list, g));
        std::fputs(one_graph.plan_text().c_str(), stdout);

        // 4. One graph per generation (the first run is the bucket's eager warmup, the second
        //    captures the graph and launches it).
        for (int round = 0; round < 2; ++round) {
            served.set_prompts(prompts, n, n, g.prompt_len, s);
            one_graph.run(one_graph.choose(n), s);
        }
        const std::vector<int> graphed = served.copy_generated(n, g, s);
        // [snippet one_graph]

        // 5. The same program eagerly: the runner reads the loop's flag on the host before each pass.
        inference_runner<serve_eager> eager(served.generate_program(bucket_list, g));
        served.set_prompts(prompts, n, n, g.prompt_len, s);
        eager.run(eager.choose(n), s);
        const std::vector<int> on_host = served.copy_generated(n, g, s);

        // 6. One graph per token: the prompts' forward with the first token, then one step per token.
        inference_runner<serve_block> prefill(served.prefill_program(bucket_list, g)), step(served.decode_step_program(bucket_list, g));
        int launches = 0;
        for (int round = 0; round < 2; ++round) {
            launches = 0;
            served.set_prompts(prompts, n, n, g.prompt_len, s);
            prefill.run(prefill.choose(n), s);
            ++launches;
            for (int i = 1; i < g.max_new; ++i, ++launches) step.run(step.choose(n), s);
        }
        const std::vector<int> per_token = served.copy_generated(n, g, s);

        int right = 0;
        for (int r = 0; r < n; ++r) {
            std::printf("prompt");
            for (int i = 0; i < g.prompt_len; ++i) std::printf(" %2d", prompts[std::size_t(r * g.prompt_len + i)]);
            std::printf("  ->");
            for (int i = 0; i < g.max_new; ++i) {
                const int t = graphed[std::size_t(r * g.max_new + i)];
                right += t == answers[std::size_t(r * g.max_new + i)];
                std::printf(" %2d", t);
            }
            std::printf("\n");
        }
        const runner_counters& k = one_graph.counters();
        std::printf("one graph: %ld launches for 2 generations (the first ran eagerly), %ld conditional node; eager: %ld host reads of the "
                    "flag; per token: %d launches a generation\n",
                    k.replays, k.conditional_nodes, eager.counters().guard_reads, launches);
        const bool same = graphed == on_host && graphed == per_token;
        std::printf("%d of %d symbols reversed right; the same tokens one graph, eager and per token: %s\n", right, n * tutorial::symbols,
                    same ? "yes" : "NO");
        return same && right >= n * tutorial::symbols * 3 / 4 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "13_decode_loop: %s\n", e.what());
        return 1;
    }
}
