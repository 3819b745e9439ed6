// Inference buckets on the host (no GPU): choosing a bucket, padding, the P6/P7 errors, the
// eager fallback, Megatron's derived batch sizes, and the per-bucket inference plan.

#include "fake_program.hpp"

#include <capscope/capscope.hpp>

#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace capscope;

namespace {

//! The microbatches' stage lists as the forwards of buckets `sizes`.
inference_program as_inference(const training_program& p, std::vector<int> sizes) {
    inference_program out;
    out.buckets = p.microbatches;
    out.bucket_sizes = std::move(sizes);
    return out;
}

//! Bucket `b`'s segments: "g0:layer0.attention+layer0.mlp e:head".
std::string summary(const inference_plan& plan, const inference_program& program, int b) {
    std::string out;
    for (const plan_segment* s = plan.bucket_begin(b); s != plan.bucket_end(b); ++s) {
        out += out.empty() ? "" : " ";
        out += s->graphed ? "g" + std::to_string(s->graph) + ":" : std::string("e:");
        for (int k = 0; k < s->call_count; ++k) out += (k ? "+" : "") + stage_of(program, plan.calls[std::size_t(s->first_call + k)]).name;
    }
    return out;
}

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

} // namespace

TEST_CASE("a request runs in the smallest bucket that holds it, padded with masked rows") {
    const bucket_list b{1, 2, 4, 8, 16};
    CHECK(choose_bucket(b, 1) == bucket_choice{0, 1, 1});
    CHECK(choose_bucket(b, 3) == bucket_choice{2, 4, 3});
    CHECK(choose_bucket(b, 8) == bucket_choice{3, 8, 8});
    const bucket_choice c = choose_bucket(b, 9);
    CHECK(c.index == 4);
    CHECK(c.size == 16);
    CHECK(c.padded() == 7);
    CHECK(c.real_row(8));
    CHECK_FALSE(c.real_row(9));
    CHECK_FALSE(c.real_row(-1));
    // Every n up to the largest: the bucket holds it, and the one below does not.
    for (int n = 1; n <= 16; ++n) {
        const bucket_choice k = choose_bucket(b, n);
        CHECK(k.size >= n);
        CHECK((k.index == 0 || b[k.index - 1] < n));
    }
}

TEST_CASE("a request past the largest bucket is rule P6, naming both sizes, unless it may run eagerly") {
    const bucket_list b{1, 2, 4, 8, 16};
    const std::string e = error_of([&] { choose_bucket(b, 20); });
    CHECK(e.find("capscope plan rule P6: a request of 20 rows is larger than the largest bucket, 16") == 0);
    CHECK(e.find("buckets {1, 2, 4, 8, 16}") != std::string::npos);
    CHECK(e.find("-- fix: add a bucket of at least 20") != std::string::npos);
    try {
        choose_bucket(b, 17);
        FAIL("no error");
    } catch (const bucket_overflow& o) {
        CHECK(o.rule() == "P6");
        CHECK(o.requested() == 17);
        CHECK(o.largest() == 16);
    }
    const bucket_choice eager = choose_bucket(b, 20, oversize::run_eagerly);
    CHECK(eager.eager());
    CHECK(eager.size == 20);
    CHECK(eager.padded() == 0);
    CHECK(error_of([&] { choose_bucket(b, 0); }).find("at least one row") != std::string::npos);
}

TEST_CASE("length buckets: a batch pads to the smallest bucket >= its longest sample; P7 names the sample") {
    const bucket_list lengths{8, 16, 32};
    const std::vector<int> batch{5, 11, 3};
    const length_padding p = choose_length_bucket(lengths, batch);
    CHECK(p.bucket.size == 16);
    CHECK(p.bucket.requested == 11);
    CHECK(p.samples == 3);
    CHECK(p.padded_positions(batch) == 11 + 5 + 13);
    const std::vector<int> too_long{4, 40, 50};
    const std::string e = error_of([&] { choose_length_bucket(lengths, too_long); });
    CHECK(e.find("capscope plan rule P7: sample 1 has length 40, more than the largest length bucket, 32") == 0);
    CHECK(e.find("-- fix:") != std::string::npos);
    const std::vector<int> empty_sample{4, 0};
    CHECK(error_of([&] { choose_length_bucket(lengths, empty_sample); }).find("sample 1 has length 0") != std::string::npos);
}

TEST_CASE("Megatron's decode-graph batch sizes, derived as Megatron derives them") {
    // The docstring example of _calculate_cuda_graph_token_counts.
    CHECK(megatron_cuda_graph_batch_sizes(8, 128) == bucket_list{1, 2, 4, 8, 16, 32, 64, 128});
    // Megatron's defaults: 16 graphs, 512 max tokens.
    CHECK(megatron_cuda_graph_batch_sizes(16, 512) == bucket_list{1, 2, 4, 8, 16, 32, 64, 128, 256, 512});
    // Fewer graphs than halvings: trimmed from the small end, keeping the smallest (tp_size).
    CHECK(megatron_cuda_graph_batch_sizes(4, 512) == bucket_list{1, 128, 256, 512});
    CHECK(megatron_cuda_graph_batch_sizes(1, 100) == bucket_list{100});
    // Tensor parallelism aligns every size to tp_size.
    CHECK(megatron_cuda_graph_batch_sizes(16, 100, 4) == bucket_list{4, 8, 12, 24, 52, 100});
    // -1: automatic count, max(4, log2(max) + 2).
    CHECK(megatron_cuda_graph_batch_sizes(-1, 64) == bucket_list{1, 2, 4, 8, 16, 32, 64});
    // linear sizing
    CHECK(megatron_cuda_graph_batch_sizes(4, 64, 1, bucket_sizing::linear) == bucket_list{16, 32, 48, 64});
    CHECK(megatron_cuda_graph_batch_sizes(-1, 40, 1, bucket_sizing::linear) == bucket_list{1, 2, 4, 8, 16, 24, 32, 40});
    CHECK(error_of([] { megatron_cuda_graph_batch_sizes(0, 64); }).find("must be >= 1 or -1") != std::string::npos);
    // The config option computes the same list at compile time.
    using cfg = config<impl::lazy_per_layer, inference::per_layer, megatron_buckets<8, 128>>;
    static_assert(cfg::engine.batch_buckets == bucket_list{1, 2, 4, 8, 16, 32, 64, 128});
}

TEST_CASE("bucket options are engine options beside the Megatron configuration") {
    using cfg = config<impl::lazy_per_layer, inference::per_block, buckets<1, 2, 4, 8>, oversize_requests<oversize::run_eagerly>,
                       bucket_execs<bucket_exec::shared>>;
    static_assert(cfg::engine.batch_buckets == bucket_list{1, 2, 4, 8});
    static_assert(cfg::engine.on_oversize == oversize::run_eagerly);
    static_assert(cfg::engine.execs == bucket_exec::shared);
    static_assert(cfg::inference == inference_scope::per_block);
    using plain = config<impl::lazy_per_layer, inference::per_block>;
    static_assert(same_config<cfg, plain>); // the Megatron part is the same
    static_assert(plain::engine.batch_buckets.empty());
    using vis = config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<16, 32, 64>>;
    static_assert(vis::engine.length_buckets == bucket_list{16, 32, 64});
}

TEST_CASE("inference plan, scope layer: per-layer graphs of the captured regions, the same in every bucket") {
    fake::model m;
    const auto p = as_inference(m.program("DEM", false, 3), {1, 4, 8});
    const bucket_list sizes{1, 4, 8};
    const auto plan = make_inference_plan(inference_scope::per_layer, {}, sizes, p);
    CHECK(plan.graphs_per_bucket == 3);
    CHECK(plan.segments_per_bucket == 5);
    CHECK(plan.eager_islands_per_run() == 2);
    for (int b = 0; b < 3; ++b) CHECK(summary(plan, p, b).find("e:embedding") == 0);
    CHECK(summary(plan, p, 1) ==
          "e:embedding.mb1 g0:layer0.attention+layer0.mlp g1:layer1.attention+layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts "
          "g2:layer2.mamba e:head.mb1");
    // Modules narrow it: attention only.
    const auto attn = make_inference_plan(inference_scope::per_layer, {capture_module::attention}, sizes, p);
    CHECK(summary(attn, p, 0) ==
          "e:embedding.mb0 g0:layer0.attention e:layer0.mlp g1:layer1.attention e:layer1.moe_router+layer1.moe_preprocess+layer1.moe_experts "
          "e:layer2.mamba e:head.mb0");
    // Dropless MoE in a whole-layer capture: P1, as in training.
    const auto dropless = as_inference(m.program("E", true, 3), {1, 4, 8});
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, sizes, dropless); }).find("capscope plan rule P1:") == 0);
    CHECK(make_inference_plan(inference_scope::per_layer, {capture_module::attention}, sizes, dropless).graphs_per_bucket == 1);
}

TEST_CASE("inference plan, scope block: the whole forward, embedding to logits, as one graph") {
    fake::model m;
    const auto p = as_inference(m.program("DM", false, 2), {2, 4});
    const auto plan = make_inference_plan(inference_scope::per_block, {}, bucket_list{2, 4}, p);
    CHECK(plan.graphs_per_bucket == 1);
    CHECK(plan.segments_per_bucket == 1);
    CHECK(summary(plan, p, 1) == "g0:embedding.mb1+layer0.attention+layer0.mlp+layer1.mamba+head.mb1");
    const auto eager = make_inference_plan(inference_scope::eager, {}, bucket_list{2, 4}, p);
    CHECK(eager.graphs_per_bucket == 0);
    const auto dropless = as_inference(m.program("E", true, 2), {2, 4});
    const std::string e = error_of([&] { make_inference_plan(inference_scope::per_block, {}, bucket_list{2, 4}, dropless); });
    CHECK(e.find("capscope plan rule P1: stage 'layer0.moe_preprocess' synchronizes with the host, yet inference scope block captures the "
                 "whole forward -- fix: use inference scope layer") == 0);
    CHECK(to_text(plan, p) == "capscope inference plan: scope block (the whole forward as one graph), buckets {2, 4}\n"
                              "  per bucket: 1 graph, 0 eager islands\n"
                              "  g0  graph  embedding.mb0, layer0.attention, layer0.mlp, layer1.mamba, head.mb0\n");
}

TEST_CASE("the inference program's shape is checked against the buckets") {
    fake::model m;
    auto p = as_inference(m.program("DM", false, 2), {1, 2});
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 2, 4}, p); })
              .find("capscope plan rule P3: the inference program has 2 stage lists for 3 buckets {1, 2, 4}") == 0);
    // Built for other buckets: each list records its size, and a mismatch names both.
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 4}, p); }) ==
          "capscope plan rule P3: stage list 1 of the inference program was built for bucket 2, but the runner's bucket 1 is 4 "
          "(runner {1, 4}) -- fix: build the program from the runner's bucket list (its config's buckets<...> or length_buckets<...>)");
    auto unsized = p;
    unsized.bucket_sizes.clear();
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 2}, unsized); })
              .find("capscope plan rule P3: the inference program records 0 bucket sizes for 2 stage lists") == 0);
    // A forward runs on one stream: side lanes are for training programs.
    auto laned = p;
    laned.buckets[0][1].lane = laned.buckets[1][1].lane = 1;
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 2}, laned); })
              .find("capscope plan rule P3: stage 'layer0.attention' of an inference program uses a side lane") == 0);
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{4, 2}, p); }).find("capscope plan rule P4:") == 0);
    p.buckets[1].pop_back();
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 2}, p); })
              .find("capscope plan rule P3: bucket 2 has 4 stages, bucket 1 has 5") == 0);
    auto q = as_inference(m.program("DM", false, 2), {1, 2});
    q.buckets[1][1].layer = 7;
    CHECK(error_of([&] { make_inference_plan(inference_scope::per_layer, {}, bucket_list{1, 2}, q); })
              .find("differs from the first bucket's") != std::string::npos);
}

TEST_CASE("Megatron's own batch sizes, recorded from d98e8a64dd, match capscope's derivation case for case") {
    // tools/conformance/megatron_batch_sizes.py ran Megatron's _calculate_cuda_graph_token_counts
    // over this grid on the GPU machine (it needs torch).
    std::ifstream in(CAPSCOPE_UNIT_DATA "/megatron_batch_sizes.jsonl");
    REQUIRE(in.good());
    const std::regex line_re(R"re(\{"num_cuda_graphs": (-?\d+), "max_tokens": (\d+), "tp_size": (\d+), "sizing": "(\w+)", "sizes": \[([\d, ]*)\]\})re");
    std::string line;
    int cases = 0, agree = 0;
    while (std::getline(in, line)) {
        std::smatch m;
        REQUIRE_MESSAGE(std::regex_match(line, m, line_re), line);
        bucket_list want;
        std::stringstream sizes(m[5].str());
        for (std::string v; std::getline(sizes, v, ',');) want.push_back(std::stoi(v));
        const bucket_list got = megatron_cuda_graph_batch_sizes(std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]),
                                                                m[4] == "linear" ? bucket_sizing::linear : bucket_sizing::exponential);
        CHECK_MESSAGE(got == want, line, " -> capscope: ", capscope::detail::bucket_text(got));
        ++cases;
        agree += got == want;
    }
    MESSAGE(agree << " of " << cases << " cases agree");
    CHECK(cases == 960);
}
