// Tutorial 07: a vision encoder over images of different sizes, with padding buckets.
//
// Each image is a variable number of patches. A graph needs fixed shapes, so a batch is padded to
// one length and attention masks the padded keys (Megatron-Bridge pads every batch to
// `max_vision_cuda_graph_seq_length`). Padding everything to the longest possible image wastes
// work on small ones; length buckets pad a batch to the smallest bucket that holds its longest
// image, with one graph per bucket.
//
// The encoder gets its own runner, `vision_runner<Config>`, built from the config's vision part
// only (its impl and modules, rules V1-V5), never from the language model's settings. Here the
// language model captures nothing, and the encoder captures whole layers ahead of time.
//
//   07_vision_buckets        Exits 1 if a graph's output differs from eager, 77 without a GPU.

#include <gpt/vision.hpp>

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace capscope;
using T = __nv_bfloat16;

// [snippet configs]
using pad_to_max = config<impl::eager, vision<impl::ahead_of_time_per_layer, modules<>, max_seq_length<256>>, warmup_steps<1>>;
using bucketed = config<impl::eager, vision<impl::ahead_of_time_per_layer, modules<>, max_seq_length<256>>, length_buckets<64, 144, 256>,
                        warmup_steps<1>>;
// [snippet configs]

std::vector<float> random_patches(int count, int patch_dim, std::mt19937& rng) {
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> p(std::size_t(count) * patch_dim);
    for (float& x : p) x = d(rng);
    return p;
}

// [snippet run]
template <class Runner>
double run_ms(Runner& r, gpt::vision_encoder<T>& enc, const std::vector<float>& patches, const std::vector<int>& lengths, cudaStream_t s,
              std::vector<float>* out) {
    const bucket_choice c = r.choose_lengths(lengths);
    enc.set_samples(patches, lengths, c.size, s);
    auto t0 = cuda::event::timing(), t1 = cuda::event::timing();
    for (int i = 0; i < 3; ++i) r.run(c, s); // the bucket's eager warmup, then the capture of every bucket (ahead of time)
    t0.record(s);
    for (int i = 0; i < 50; ++i) r.run(c, s);
    t1.record(s);
    t1.synchronize();
    if (out) *out = enc.copy_outputs(lengths, c.size, s);
    return cuda::event::elapsed_ms(t0, t1) / 50.0;
}
// [snippet run]

int main() {
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cuda::stream s;
        gpt::vision_config vc;
        vc.patch_dim = 48;
        vc.hidden = 256;
        vc.heads = 8;
        vc.ffn_hidden = 1024;
        vc.layers = 4;
        vc.batch = 4;
        vc.max_patches = 256;
        vc.padded_len = 256;
        vc.training = false; // forward only
        gpt::vision_encoder<T> enc(vc, s);

        // [snippet runners]
        const int bucket_list[] = {64, 144, 256}, max_only[] = {256};
        vision_runner<bucketed> by_bucket(enc.inference_program(bucket_list));
        vision_runner<pad_to_max> padded(enc.inference_program(max_only));
        std::fputs(by_bucket.plan_text().c_str(), stdout);
        // [snippet runners]

        std::mt19937 rng(11);
        bool identical = true;
        for (const std::vector<int>& lengths : std::vector<std::vector<int>>{{49, 64, 36, 16}, {100, 144, 81, 64}, {196, 256, 9, 121}, {25, 30}}) {
            int total = 0;
            for (int l : lengths) total += l;
            const auto patches = random_patches(total, vc.patch_dim, rng);
            // Eager, in the same bucket: the graph must give the same bits on the real patches.
            const bucket_choice c = by_bucket.choose_lengths(lengths);
            enc.set_samples(patches, lengths, c.size, s);
            run_forward(enc.forward_stages(c.size), s);
            const auto eager = enc.copy_outputs(lengths, c.size, s);
            std::vector<float> graphed;
            const double bucket_ms = run_ms(by_bucket, enc, patches, lengths, s, &graphed);
            const double max_ms = run_ms(padded, enc, patches, lengths, s, nullptr);
            const bool same = graphed.size() == eager.size() && std::memcmp(graphed.data(), eager.data(), eager.size() * sizeof(float)) == 0;
            identical &= same;
            std::printf("images with %3d..%3d patches: length bucket %3d (%4d padded positions), %.3f ms; padded to 256: %.3f ms; "
                        "graph == eager: %s\n",
                        *std::min_element(lengths.begin(), lengths.end()), *std::max_element(lengths.begin(), lengths.end()), c.size,
                        vc.batch * c.size - total, bucket_ms, max_ms, same ? "yes" : "NO");
        }
        const runner_counters& k = by_bucket.counters();
        std::printf("bucketed runner: %ld forwards, %ld captures (every bucket, ahead of time), %ld replays; graphs alive %d\n", k.steps,
                    k.captures, k.replays, by_bucket.graphs_alive());
        try {
            const std::vector<int> too_big{64, 300};
            by_bucket.choose_lengths(too_big);
        } catch (const bucket_overflow& e) {
            std::printf("an image of 300 patches: %s\n", e.what());
        }
        by_bucket.reset();
        std::printf("after reset(): graphs alive %d\n", by_bucket.graphs_alive());
        return identical ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "07_vision_buckets: %s\n", e.what());
        return 1;
    }
}
