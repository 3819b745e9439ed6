// Inference runners on the GPU: scope layer and block, bitwise equal to eager execution in every
// bucket; padded rows never reach the real rows' results; the past-the-largest error and the
// eager fallback; exec update after rebinding the inputs (and from a sibling bucket), equal to
// freshly instantiated graphs; the vision encoder in length buckets; no graph alive after
// reset() or destruction; and the forward-only model allocates no training state.

#include "support.hpp"

#include <gpt/inference.hpp>
#include <gpt/model.hpp>
#include <gpt/vision.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace capscope;

namespace {

// Capacity factor = experts / top_k: an expert has room for every token, so no real token is
// ever dropped, whichever bucket (or unpadded size) it runs in.
constexpr double no_drop = 2.0;
using moe_facts = model<experts<4>, moe_pattern<0, 1, 0>, capacity_factor<2.0>, pad_to_capacity>;
using sizes = buckets<1, 2, 4, 8>;
using layer_cfg = config<impl::lazy_per_layer, inference::per_layer, moe_facts, warmup_steps<1>, sizes>;
using block_cfg = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, sizes>;

//! "DEM", capacity 16 sequences: buckets up to 8, and room to run larger requests eagerly.
gpt::model_config serving_model() {
    gpt::model_config c = support::small_model("DEM", gpt::moe_mode::drop_and_pad, no_drop);
    c.batch = 16;
    return c;
}

std::vector<int> random_tokens(int n, const gpt::model_config& c, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> tok(0, c.vocab - 1);
    std::vector<int> t(std::size_t(n) * c.seq_len);
    for (int& x : t) x = tok(rng);
    return t;
}

template <class T> std::vector<T> logits_of(const gpt::inference_model<T>& m, int rows, cudaStream_t s) {
    return support::download(m.logits(), std::size_t(rows) * m.config().seq_len * m.config().vocab, s);
}

template <class T> void poison_logits(const gpt::inference_model<T>& m, int rows, cudaStream_t s) {
    support::poison(m.logits(), std::size_t(rows) * m.config().seq_len * m.config().vocab * sizeof(T), s);
}

template <class T> bool rows_zero(const std::vector<T>& logits, std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i)
        if (support::to_double(logits[i]) != 0.0) return false;
    return true;
}

//! Poisons every buffer a stage of the bucket of `size` declares as its output (the layers'
//! outputs, not only the logits): a graph that did not run leaves NaNs for the next to read.
void poison_outputs(const inference_program& p, int size, cudaStream_t s) {
    for (std::size_t b = 0; b < p.bucket_sizes.size(); ++b)
        if (p.bucket_sizes[b] == size)
            for (const stage& st : p.buckets[b])
                for (const tensor_ref& t : st.outputs) support::poison(t.data, t.bytes, s);
}

//! For every request size 1..8: eager forward of the padded bucket vs the runner's replay, bitwise.
template <class Config, class T> void check_parity_every_bucket(const char* name) {
    cuda::stream s;
    gpt::inference_model<T> m(serving_model(), s.get());
    const inference_program program = m.inference_program(Config::engine.batch_buckets.view());
    inference_runner<Config> r(program);
    const std::size_t row = std::size_t(m.config().seq_len) * m.config().vocab;
    int compared = 0;
    for (int pass = 0; pass < 2; ++pass) // pass 0 warms every bucket up (eager), pass 1 replays
        for (int n = 1; n <= 8; ++n) {
            const bucket_choice c = r.choose(n);
            m.set_request(random_tokens(n, m.config(), 100 + std::uint64_t(n)), n, c.size, s.get());
            m.forward(c.size, s.get());
            const auto eager = logits_of(m, c.size, s.get());
            const long replays = r.counters().replays;
            // The eager result is kept on the host; the runner must write every row of every
            // graph's output itself (a no-op replay of any graph, or a smaller bucket's, leaves NaNs).
            poison_logits(m, c.size, s.get());
            poison_outputs(program, c.size, s.get());
            r.run(c, s.get());
            const auto graphed = logits_of(m, c.size, s.get());
            CHECK_MESSAGE(!support::any_nan(graphed), name, " n=", n, " bucket ", c.size, ": rows left unwritten");
            CHECK_MESSAGE(support::same_bits(graphed, eager), name, " n=", n, " bucket ", c.size);
            CHECK(rows_zero(graphed, std::size_t(n) * row, std::size_t(c.size) * row)); // padded rows masked
            if (pass == 1) {
                CHECK(r.counters().replays - replays == r.plan().graphs_per_bucket);
                ++compared;
            }
        }
    const runner_counters& k = r.counters();
    CHECK(compared == 8);
    CHECK(k.captures == 4L * r.plan().graphs_per_bucket); // each bucket's graphs captured once
    CHECK(k.instantiations == k.captures);
    CHECK(r.executable_graphs() == 4 * r.plan().graphs_per_bucket);
    std::printf("inference %s (%s): %d graph(s) per bucket, %d eager island(s); counters: runs %ld, captures %ld, instantiations %ld, "
                "replays %ld, eager islands run %ld\n",
                name, support::precision_name<T>, r.plan().graphs_per_bucket, r.plan().eager_islands_per_run(), k.steps, k.captures,
                k.instantiations, k.replays, k.eager_segment_runs);
}

} // namespace

TEST_CASE("forward-only model: the training model's weights, no gradient or optimizer state") {
    cuda::stream s;
    // Large enough that cudaMemGetInfo's 2 MiB granularity does not hide the difference.
    gpt::model_config c = serving_model();
    c.hidden = 256;
    c.ffn_hidden = 1024;
    c.vocab = 1024;
    c.layer_pattern = "DDEM";
    c.moe_mode = gpt::moe_mode::drop_and_pad;
    std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
    gpt::inference_model<float> first(serving_model(), s.get()); // the context, cuBLAS and modules set up before measuring
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    CAPSCOPE_CHECK(cudaMemGetInfo(&free0, &total));
    gpt::inference_model<float> inf(c, s.get());
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    CAPSCOPE_CHECK(cudaMemGetInfo(&free1, &total));
    gpt::gpt_model<float> train(c, s.get());
    CAPSCOPE_CHECK(cudaDeviceSynchronize());
    CAPSCOPE_CHECK(cudaMemGetInfo(&free2, &total));
    const double inf_mib = double(free0 - free1) / (1 << 20), train_mib = double(free1 - free2) / (1 << 20);
    std::printf("forward-only model: %.2f MiB on the device; training model of the same config: %.2f MiB\n", inf_mib, train_mib);
    CHECK(inf.parameters().device_bytes() == inf.parameters().total() * sizeof(float)); // values only
    CHECK(train.parameters().device_bytes() == 5 * train.parameters().total() * sizeof(float));
    CHECK(inf_mib < train_mib);
    CHECK(inf.parameters().masters() == nullptr);
    CHECK(inf.parameters().grads() == nullptr);
    // Same config, same seed: the same weights, bit for bit.
    for (std::size_t i = 0; i < inf.parameters().list().size(); ++i)
        CHECK(support::same_bits(support::download(inf.parameters().value(i), inf.parameters().list()[i].count, s.get()),
                                 support::download(train.parameters().value(i), train.parameters().list()[i].count, s.get())));
}

TEST_CASE("scope layer: per-layer graphs bitwise equal to eager in every bucket, padded rows masked") {
    check_parity_every_bucket<layer_cfg, float>("layer");
    check_parity_every_bucket<layer_cfg, __nv_bfloat16>("layer");
}

TEST_CASE("scope block: the whole forward as one graph, bitwise equal to eager in every bucket") {
    check_parity_every_bucket<block_cfg, float>("block");
    check_parity_every_bucket<block_cfg, __nv_bfloat16>("block");
}

TEST_CASE("padded rows never reach the real rows; the real rows match the request run alone") {
    cuda::stream s;
    gpt::inference_model<float> m(serving_model(), s.get());
    inference_runner<block_cfg> r(m.inference_program(block_cfg::engine.batch_buckets.view()));
    const int n = 3;
    const auto tokens = random_tokens(n, m.config(), 7);
    const bucket_choice c = r.choose(n);
    CHECK(c.size == 4);
    const std::size_t real = std::size_t(n) * m.config().seq_len * m.config().vocab;
    std::vector<std::vector<float>> runs;
    for (int pad_token : {0, 5, 31}) { // whatever the padded rows hold
        m.set_request(tokens, n, c.size, s.get(), 0, pad_token);
        r.run(c, s.get()); // (the first run is the bucket's eager warmup)
        poison_logits(m, c.size, s.get());
        r.run(c, s.get());
        runs.push_back(logits_of(m, c.size, s.get()));
        CHECK(rows_zero(runs.back(), real, runs.back().size()));
    }
    CHECK(r.counters().replays == 5);
    for (auto& v : runs) v.resize(real);
    CHECK(support::same_bits(runs[1], runs[0]));
    CHECK(support::same_bits(runs[2], runs[0]));
    // The request alone, unpadded (3 rows, eagerly): cuBLAS may choose other kernels for 3 rows
    // than for 4, so equal within floating-point tolerance, not bitwise.
    m.set_request(tokens, n, n, s.get());
    m.forward(n, s.get());
    const auto alone = logits_of(m, n, s.get());
    std::vector<double> a(alone.begin(), alone.end()), b(runs[0].begin(), runs[0].end());
    const double err = support::relative_error(b, a);
    std::printf("padded bucket 4 vs the 3 rows alone: relative error %.3g\n", err);
    CHECK(err < 1e-5);
}

TEST_CASE("a request past the largest bucket: rule P6 naming both sizes, or eagerly when the config says so") {
    cuda::stream s;
    gpt::inference_model<float> m(serving_model(), s.get());
    inference_runner<layer_cfg> strict(m.inference_program(layer_cfg::engine.batch_buckets.view()));
    try {
        strict.choose(12);
        FAIL("no error past the largest bucket");
    } catch (const bucket_overflow& e) {
        CHECK(std::string(e.what()).find("capscope plan rule P6: a request of 12 rows is larger than the largest bucket, 8") == 0);
    }
    using eager_past = config<impl::lazy_per_layer, inference::per_layer, moe_facts, warmup_steps<1>, sizes,
                              oversize_requests<oversize::run_eagerly>>;
    inference_runner<eager_past> lenient(m.inference_program(eager_past::engine.batch_buckets.view()));
    const auto tokens = random_tokens(12, m.config(), 12);
    m.set_request(tokens, 12, 12, s.get());
    m.forward(12, s.get());
    const auto eager = logits_of(m, 12, s.get());
    CAPSCOPE_CHECK(cudaMemsetAsync(const_cast<float*>(m.logits()), 0xff, eager.size() * sizeof(float), s.get()));
    const bucket_choice c = lenient.run(12, s.get());
    CHECK(c.eager());
    CHECK(lenient.counters().oversize_runs == 1);
    CHECK(lenient.counters().captures == 0);
    CHECK(support::same_bits(logits_of(m, 12, s.get()), eager));
    CHECK_THROWS_AS(lenient.run(17, s.get()), std::out_of_range); // past the model's capacity: the model says so
}

TEST_CASE("rebinding the inputs updates the executable graphs in place, equal to freshly instantiated ones") {
    cuda::stream s;
    gpt::inference_model<float> m(serving_model(), s.get());
    const auto bucket_sizes = block_cfg::engine.batch_buckets.view();
    inference_runner<block_cfg> r(m.inference_program(bucket_sizes, 0));
    r.capture_all(s.get());
    const runner_counters before = r.counters();
    CHECK(before.instantiations == 4);
    // The next request goes to input slot 1 (double buffering); the graphs move there.
    const auto tokens = random_tokens(4, m.config(), 44);
    m.set_request(tokens, 4, 4, s.get(), 1);
    r.rebind(m.inference_program(bucket_sizes, 1));
    // Eager on slot 1 first, kept on the host; then the rebound graphs, on poisoned logits.
    m.forward(4, s.get(), 1);
    const auto eager_slot1 = logits_of(m, 4, s.get());
    poison_logits(m, 4, s.get());
    r.run(r.choose(4), s.get());
    const auto updated = logits_of(m, 4, s.get());
    CHECK(!support::any_nan(updated));
    CHECK(support::same_bits(updated, eager_slot1));
    const runner_counters& k = r.counters();
    std::printf("rebind to input slot 1: captures %ld, exec updates %ld, update refusals %ld, instantiations %ld (before: %ld)\n",
                k.captures - before.captures, k.exec_updates, k.update_refusals, k.instantiations - before.instantiations,
                before.instantiations);
    CHECK(k.captures == before.captures + 1);
    CHECK(k.exec_updates == 1);
    CHECK(k.instantiations == before.instantiations);
    // A fresh runner on slot 1, instantiated from scratch, and eager execution agree.
    inference_runner<block_cfg> fresh(m.inference_program(bucket_sizes, 1));
    fresh.capture_all(s.get());
    poison_logits(m, 4, s.get());
    fresh.run(fresh.choose(4), s.get());
    CHECK(support::same_bits(logits_of(m, 4, s.get()), updated));
    // Scope layer keeps the embedding and the head eager: nothing graphed reads the input slot.
    inference_runner<layer_cfg> per_layer(m.inference_program(bucket_sizes, 0));
    per_layer.capture_all(s.get());
    per_layer.rebind(m.inference_program(bucket_sizes, 1));
    poison_logits(m, 4, s.get());
    per_layer.run(per_layer.choose(4), s.get());
    CHECK(per_layer.counters().exec_updates == 0);
    CHECK(per_layer.counters().captures == 4L * per_layer.plan().graphs_per_bucket);
    CHECK(support::same_bits(logits_of(m, 4, s.get()), updated));
    // Other stages are not a rebind (P3); the runner keeps its program.
    auto fewer = m.inference_program(bucket_sizes, 1);
    for (auto& list : fewer.buckets) list.pop_back();
    try {
        r.rebind(std::move(fewer));
        FAIL("rebind took other stages");
    } catch (const plan_error& e) {
        CHECK(std::string(e.what()).find("capscope plan rule P3: rebind: bucket 1 has 8 stages, the bound program's has 9") == 0);
    }
    auto moved = m.inference_program(bucket_sizes, 1);
    moved.buckets[2][1].layer = 5;
    CHECK_THROWS_AS(r.rebind(std::move(moved)), plan_error);
    poison_logits(m, 4, s.get());
    r.run(r.choose(4), s.get());
    CHECK(support::same_bits(logits_of(m, 4, s.get()), updated));
}

TEST_CASE("bucket_exec::shared: one executable graph per segment, updated from the bucket's captured graph") {
    cuda::stream s;
    gpt::inference_model<float> m(serving_model(), s.get());
    using shared_cfg = config<impl::lazy_per_layer, inference::per_layer, moe_facts, warmup_steps<1>, sizes, bucket_execs<bucket_exec::shared>>;
    inference_runner<shared_cfg> r(m.inference_program(shared_cfg::engine.batch_buckets.view()));
    const int g = r.plan().graphs_per_bucket;
    const int order[] = {1, 4, 2, 8, 4, 1, 8, 2, 4};
    for (int pass = 0; pass < 2; ++pass)
        for (int n : order) {
            m.set_request(random_tokens(n, m.config(), 900 + std::uint64_t(n)), n, n, s.get());
            m.forward(n, s.get());
            const auto eager = logits_of(m, n, s.get());
            const long updates = r.counters().exec_updates + r.counters().update_refusals;
            poison_logits(m, n, s.get());
            r.run(r.choose(n), s.get());
            const auto graphed = logits_of(m, n, s.get());
            CHECK_MESSAGE(!support::any_nan(graphed), "bucket ", n, ": rows left unwritten");
            CHECK_MESSAGE(support::same_bits(graphed, eager), "bucket ", n);
            // After the warmup pass every run changes bucket, so each of its graphs is loaded anew
            // into the shared executable graphs: updated in place, or instantiated where refused.
            if (pass == 1) CHECK(r.counters().exec_updates + r.counters().update_refusals - updates == g);
        }
    const runner_counters& k = r.counters();
    std::printf("shared executable graphs: %d executable, %d captured kept; captures %ld, instantiations %ld, exec updates %ld, "
                "update refusals %ld (last: %s), replays %ld\n",
                r.executable_graphs(), r.captured_graphs(), k.captures, k.instantiations, k.exec_updates, k.update_refusals,
                r.last_update_refusal(), k.replays);
    CHECK(r.executable_graphs() == g);
    CHECK(r.captured_graphs() == 4 * g);
    CHECK(k.captures == 4L * g);
    CHECK(k.exec_updates + k.update_refusals > 0);
    CHECK(k.instantiations == g + k.update_refusals);
}

TEST_CASE("no graph is alive after reset() or destruction, counted by the runner and by capscope's graph owners") {
    cuda::stream s;
    gpt::inference_model<float> m(serving_model(), s.get());
    const cuda::graph_census baseline = cuda::live_graphs();
    {
        inference_runner<layer_cfg> r(m.inference_program(layer_cfg::engine.batch_buckets.view()));
        r.capture_all(s.get());
        const int g = 4 * r.plan().graphs_per_bucket;
        CHECK(r.graphs_alive() == g);
        CHECK(cuda::live_graphs().execs == baseline.execs + g);
        r.reset();
        CHECK(r.graphs_alive() == 0);
        CHECK(cuda::live_graphs() == baseline);
        r.capture_all(s.get());
        CHECK(cuda::live_graphs().execs == baseline.execs + g);
    }
    CHECK(cuda::live_graphs() == baseline);
    {
        using shared_cfg = config<impl::lazy_per_layer, inference::per_block, moe_facts, warmup_steps<1>, sizes, bucket_execs<bucket_exec::shared>>;
        inference_runner<shared_cfg> r(m.inference_program(shared_cfg::engine.batch_buckets.view()));
        r.capture_all(s.get());
        CHECK(cuda::live_graphs().graphs == baseline.graphs + 4); // each bucket's captured graph, kept
        CHECK(cuda::live_graphs().execs == baseline.execs + 1);
    }
    CHECK(cuda::live_graphs() == baseline);
}

namespace {
using vision_cfg = config<vision<impl::ahead_of_time_per_layer, modules<>, max_seq_length<32>>, length_buckets<8, 16, 32>, warmup_steps<1>>;

gpt::vision_config serving_vision() {
    gpt::vision_config v;
    v.batch = 3;
    v.padded_len = 32;
    v.max_patches = 32;
    v.training = false;
    return v;
}

std::vector<float> random_patches(int count, int patch_dim, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> p(std::size_t(count) * patch_dim);
    for (float& x : p) x = d(rng);
    return p;
}
} // namespace

TEST_CASE("vision encoder in length buckets: its own runner, bitwise equal to eager on the real patches") {
    cuda::stream s;
    gpt::vision_encoder<float> enc(serving_vision(), s.get());
    const auto lengths_buckets = vision_cfg::engine.length_buckets.view();
    vision_runner<vision_cfg> r(enc.inference_program(lengths_buckets));
    CHECK(r.plan().graphs_per_bucket == 2); // two vision layers, whole-layer graphs
    const std::vector<std::vector<int>> batches{{5, 11, 3}, {8, 2}, {30, 17, 32}, {1, 1, 1}};
    for (int pass = 0; pass < 2; ++pass)
        for (const auto& lengths : batches) {
            int total = 0;
            for (int l : lengths) total += l;
            const auto patches = random_patches(total, enc.config().patch_dim, 50 + std::uint64_t(total));
            const bucket_choice c = r.choose_lengths(lengths);
            enc.set_samples(patches, lengths, c.size, s.get());
            run_forward(enc.forward_stages(c.size), s.get());
            const auto eager = enc.copy_outputs(lengths, c.size, s.get());
            support::poison(enc.output(), std::size_t(enc.config().batch) * c.size * enc.config().hidden * sizeof(float), s.get());
            r.run(c, s.get());
            const auto graphed = enc.copy_outputs(lengths, c.size, s.get());
            CHECK_MESSAGE(support::same_bits(graphed, eager), "padded length ", c.size);
            // Padded to the largest length instead: the same real patches, within tolerance.
            enc.set_samples(patches, lengths, 32, s.get());
            run_forward(enc.forward_stages(32), s.get());
            const auto at_max = enc.copy_outputs(lengths, 32, s.get());
            std::vector<double> a(graphed.begin(), graphed.end()), b(at_max.begin(), at_max.end());
            CHECK(support::relative_error(a, b) < 1e-5);
        }
    const runner_counters& k = r.counters();
    std::printf("vision runner: length buckets {8, 16, 32}, %d graphs per bucket captured ahead of time; captures %ld, replays %ld\n",
                r.plan().graphs_per_bucket, k.captures, k.replays);
    CHECK(k.captures == 3L * r.plan().graphs_per_bucket); // every bucket, ahead of time
    CHECK(k.replays > 0);
    // A sample past the largest length bucket: P7, naming the sample, its length and the bucket.
    const std::vector<int> too_long{4, 40};
    try {
        r.choose_lengths(too_long);
        FAIL("no error");
    } catch (const bucket_overflow& e) {
        CHECK(std::string(e.what()).find("capscope plan rule P7: sample 1 has length 40, more than the largest length bucket, 32") == 0);
    }
    const cuda::graph_census alive = cuda::live_graphs();
    r.reset();
    CHECK(r.graphs_alive() == 0);
    CHECK(cuda::live_graphs().execs == alive.execs - 3L * r.plan().graphs_per_bucket);
}

TEST_CASE("the vision runner reads the vision settings only, never the language model's") {
    cuda::stream s;
    gpt::vision_encoder<float> enc(serving_vision(), s.get());
    // The language model captures attention lazily; the vision encoder is eager (impl none).
    using lm_graphs = config<impl::lazy_per_layer, modules<capture::attention>, vision<max_seq_length<32>>, warmup_steps<0>>;
    const int full[] = {32};
    vision_runner<lm_graphs> eager(enc.inference_program(full));
    CHECK(eager.plan().graphs_per_bucket == 0);
    CHECK(eager.plan().sizes == bucket_list{32}); // padded to max_seq_length
    // The vision encoder captures attention only, though the language model captures nothing.
    using vision_attn = config<impl::eager, vision<impl::ahead_of_time_per_layer, modules<capture::attention>, max_seq_length<32>>>;
    vision_runner<vision_attn> attn(enc.inference_program(full));
    CHECK(attn.plan().graphs_per_bucket == 2);
    CHECK(attn.plan().eager_islands_per_run() == 4); // patch embed, mlp x2, final norm
    const std::vector<int> lengths{20, 32};
    enc.set_samples(random_patches(52, enc.config().patch_dim, 3), lengths, 32, s.get());
    run_forward(enc.forward_stages(32), s.get());
    const auto want = enc.copy_outputs(lengths, 32, s.get());
    for (int i = 0; i < 5; ++i) attn.run(attn.choose_lengths(lengths), s.get());
    support::poison(enc.output(), std::size_t(enc.config().batch) * 32 * enc.config().hidden * sizeof(float), s.get());
    attn.run(attn.choose_lengths(lengths), s.get());
    CHECK(support::same_bits(enc.copy_outputs(lengths, 32, s.get()), want));
    CHECK(attn.counters().replays > 0);
}
