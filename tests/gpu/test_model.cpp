// Properties of the model on the GPU: bitwise determinism, dropless vs drop-and-pad agreement,
// padded vs unpadded vision inputs, the stage seam's tags, no allocation inside a step, and
// that the stage flags tell the truth about capturability.

#include "support.hpp"

#include <gpt/model.hpp>
#include <gpt/vision.hpp>

#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace {

gpt::model_config small(const char* pattern, gpt::moe_mode mode, double capacity_factor) {
    return support::small_model(pattern, mode, capacity_factor);
}

template <class T> struct step_result {
    std::vector<float> loss, grads, masters;
    std::vector<T> values;
};

template <class T> step_result<T> run_steps(const gpt::model_config& cfg, int steps) {
    capscope::cuda::stream s;
    gpt::gpt_model<T> m(cfg, s);
    step_result<T> r;
    for (int i = 0; i < steps; ++i) {
        const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 100 + i);
        m.set_batch(b.tokens, b.labels, s);
        m.zero_grad(s);
        m.forward(s);
        m.backward(s);
        m.optimizer_step(s, {});
        r.loss.push_back(m.loss(s));
    }
    const auto& p = m.parameters();
    r.grads = support::download(p.grads(), p.total(), s);
    r.masters = support::download(p.masters(), p.total(), s);
    r.values = support::download(p.values(), p.total(), s);
    return r;
}


} // namespace

TEST_CASE_TEMPLATE("a training step is bitwise deterministic", T, float, __nv_bfloat16, __half) {
    for (auto mode : {gpt::moe_mode::drop_and_pad, gpt::moe_mode::dropless}) {
        const auto cfg = small("DEMD", mode, 1.0);
        const auto a = run_steps<T>(cfg, 3);
        const auto b = run_steps<T>(cfg, 3);
        const bool same = support::same_bits(a.loss, b.loss) && support::same_bits(a.grads, b.grads) &&
                          support::same_bits(a.masters, b.masters) && support::same_bits(a.values, b.values);
        std::printf("  determinism %s %-12s: 3 steps twice, losses %.6f %.6f %.6f, identical bits: %s\n", support::precision_name<T>,
                    mode == gpt::moe_mode::dropless ? "dropless" : "drop-and-pad", a.loss[0], a.loss[1], a.loss[2], same ? "yes" : "NO");
        CHECK(support::same_bits(a.loss, b.loss));
        CHECK(support::same_bits(a.grads, b.grads));
        CHECK(support::same_bits(a.masters, b.masters));
        CHECK(support::same_bits(a.values, b.values));
        CHECK(a.loss[2] != a.loss[0]); // the steps did something
    }
}

TEST_CASE_TEMPLATE("dropless and drop-and-pad agree when no token is dropped", T, float, __nv_bfloat16, __half) {
    // capacity_factor = experts: every expert has room for every assignment.
    const auto pad_cfg = small("E", gpt::moe_mode::drop_and_pad, 4.0);
    const auto dropless_cfg = small("E", gpt::moe_mode::dropless, 1.0);
    capscope::cuda::stream s;
    gpt::gpt_model<T> pad(pad_cfg, s), dropless(dropless_cfg, s);
    const auto b = support::random_batch(pad_cfg.batch, pad_cfg.seq_len, pad_cfg.vocab, 5);
    for (auto* m : {&pad, &dropless}) {
        m->set_batch(b.tokens, b.labels, s);
        m->forward(s);
        m->backward(s);
    }
    const auto init_a = support::download(pad.parameters().values(), pad.parameters().total(), s);
    const auto init_b = support::download(dropless.parameters().values(), dropless.parameters().total(), s);
    REQUIRE(support::same_bits(init_a, init_b)); // same seed, same parameters
    const double la = pad.loss(s), lb = dropless.loss(s);
    const auto ga = support::download(pad.parameters().grads(), pad.parameters().total(), s);
    const auto gb = support::download(dropless.parameters().grads(), dropless.parameters().total(), s);
    const std::vector<double> da(ga.begin(), ga.end()), db(gb.begin(), gb.end());
    const double grad_err = support::relative_error(da, db);
    const double bound = std::is_same_v<T, float> ? 1e-5 : 2e-2;
    std::printf("  moe modes %s: loss %.7f vs %.7f, gradient rel.err %.3e (bound %.0e), bitwise equal: %s\n", support::precision_name<T>, la, lb,
                grad_err, bound, support::same_bits(ga, gb) ? "yes" : "no");
    CHECK(std::abs(la - lb) <= bound * std::abs(lb));
    CHECK(grad_err < bound);
}

TEST_CASE("drop-and-pad drops assignments once an expert is full; dropless keeps them all") {
    for (auto mode : {gpt::moe_mode::drop_and_pad, gpt::moe_mode::dropless}) {
        const auto cfg = small("E", mode, 0.25);
        capscope::cuda::stream s;
        gpt::gpt_model<float> m(cfg, s);
        const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 9);
        m.set_batch(b.tokens, b.labels, s);
        m.forward(s);
        const auto counts = support::download(m.expert_counts(0), std::size_t(cfg.experts), s);
        int kept = 0;
        for (int c : counts) kept += c;
        const int assignments = cfg.tokens() * cfg.top_k;
        std::printf("  %s with capacity factor 0.25: %d of %d assignments kept\n",
                    mode == gpt::moe_mode::dropless ? "dropless" : "drop-and-pad", kept, assignments);
        if (mode == gpt::moe_mode::dropless) {
            CHECK(kept == assignments);
        } else {
            for (int c : counts) CHECK(c <= cfg.expert_capacity());
            CHECK(kept < assignments);
        }
    }
}

TEST_CASE_TEMPLATE("vision encoder: padded batch equals each sample run unpadded, on the real patches", T, float, __nv_bfloat16, __half) {
    gpt::vision_config padded;
    padded.patch_dim = 12;
    padded.hidden = 32;
    padded.heads = 4;
    padded.ffn_hidden = 64;
    padded.layers = 2;
    padded.max_patches = 16;
    padded.batch = 3;
    padded.padded_len = 16;
    padded.init_stddev = 0.1f;
    const std::vector<int> lengths = {5, 16, 9};
    capscope::cuda::stream s;
    gpt::vision_encoder<T> enc(padded, s);
    // Real patches are random; the padding rows hold large garbage that must not leak.
    auto patches = support::random_floats(std::size_t(padded.tokens()) * padded.patch_dim, 21, 1.f);
    const auto garbage = support::random_floats(patches.size(), 22, 100.f);
    for (int b = 0; b < padded.batch; ++b)
        for (int i = lengths[b]; i < padded.padded_len; ++i)
            for (int d = 0; d < padded.patch_dim; ++d) {
                const std::size_t at = (std::size_t(b) * padded.padded_len + i) * padded.patch_dim + d;
                patches[at] = garbage[at];
            }
    enc.set_inputs(patches, lengths, s);
    enc.forward(s);
    s.synchronize();
    const auto out = support::download_as_double(enc.output(), std::size_t(padded.tokens()) * padded.hidden, s);
    const double bound = std::is_same_v<T, float> ? 1e-5 : 2e-2;
    for (int b = 0; b < padded.batch; ++b) {
        gpt::vision_config alone = padded;
        alone.batch = 1;
        alone.padded_len = lengths[b];
        gpt::vision_encoder<T> single(alone, s);
        const auto pa = support::values_of(enc.parameters(), s), pb = support::values_of(single.parameters(), s);
        REQUIRE(pa == pb); // same seed and table sizes: same weights
        const std::vector<float> own(patches.begin() + std::ptrdiff_t(b) * padded.padded_len * padded.patch_dim,
                                     patches.begin() + (std::ptrdiff_t(b) * padded.padded_len + lengths[b]) * padded.patch_dim);
        single.set_inputs(own, std::vector<int>{lengths[b]}, s);
        single.forward(s);
        s.synchronize();
        const auto ref = support::download_as_double(single.output(), std::size_t(lengths[b]) * padded.hidden, s);
        const std::vector<double> got(out.begin() + std::ptrdiff_t(b) * padded.padded_len * padded.hidden,
                                      out.begin() + (std::ptrdiff_t(b) * padded.padded_len + lengths[b]) * padded.hidden);
        const double err = support::relative_error(got, ref);
        std::printf("  vision padding %s sample %d (%2d of %d patches real): rel.err %.3e (bound %.0e)\n", support::precision_name<T>, b, lengths[b],
                    padded.padded_len, err, bound);
        CHECK(err < bound);
    }
    // Past the largest bucket: a clear error, and nothing copied.
    const std::vector<int> too_long = {5, 17, 9};
    try {
        enc.set_inputs(patches, too_long, s);
        FAIL("a sample longer than the padded length was accepted");
    } catch (const std::out_of_range& e) {
        CHECK(std::string(e.what()).find("sample 1 has 17 patches, more than this encoder's padded length 16") != std::string::npos);
    }
}

TEST_CASE("stages carry the capture modules of Megatron's regions") {
    using capscope::capture_module;
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(small("DEM", gpt::moe_mode::dropless, 1.0), s);
    std::string names;
    for (const auto& st : m.stages()) names += st.name + " ";
    CHECK(names ==
          "embedding layer0.attention layer0.mlp layer1.attention layer1.moe_router layer1.moe_preprocess layer1.moe_experts "
          "layer2.mamba head ");
    const auto& st = m.stages();
    CHECK(st[1].captured_by == capscope::capture_module_set{capture_module::attention});
    CHECK(st[2].captured_by == capscope::capture_module_set{capture_module::mlp});
    CHECK(st[4].captured_by == capscope::capture_module_set{capture_module::moe, capture_module::moe_router});
    CHECK(st[5].captured_by == capscope::capture_module_set{capture_module::moe, capture_module::moe_preprocess});
    CHECK(st[6].captured_by == capscope::capture_module_set{capture_module::moe});
    CHECK(st[7].captured_by == capscope::capture_module_set{capture_module::mamba});
    CHECK(st[0].captured_by.empty());
    CHECK(st[8].captured_by.empty());
    CHECK(st[5].synchronizes_with_host);
    CHECK(st[6].shapes_depend_on_data);
    CHECK_FALSE(st[5].capturable());
    CHECK(st[4].capturable());
    // Stage buffers chain: each layer's input is the previous stage's output.
    CHECK(st[1].inputs[0].data == st[0].outputs[0].data);
    CHECK(st[2].inputs[0].data == st[1].outputs[0].data);
}

TEST_CASE("drop-and-pad is capturable: a graph of the whole training step replays the eager steps bit for bit") {
    const auto cfg = small("DEM", gpt::moe_mode::drop_and_pad, 1.0);
    capscope::cuda::stream s;
    gpt::gpt_model<float> eager(cfg, s), graphed(cfg, s);
    for (const auto& st : graphed.stages()) CHECK(st.capturable());
    const auto first = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 3);
    graphed.set_batch(first.tokens, first.labels, s);
    s.synchronize();
    auto g = capscope::cuda::capture(s, [&](cudaStream_t cs) {
        graphed.zero_grad(cs);
        graphed.forward(cs);
        graphed.backward(cs);
        graphed.optimizer_step(cs, {});
    });
    capscope::cuda::graph_exec exec(g);
    std::printf("  capture: drop-and-pad DEM forward+backward+AdamW = %zu graph nodes\n", g.node_count());
    // Three steps on three batches: new data goes into the same input buffers, and AdamW's
    // step count advances on the device, so the replays must match eager steps 1, 2, 3.
    for (int step = 0; step < 3; ++step) {
        const auto b = step == 0 ? first : support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 3 + step);
        eager.set_batch(b.tokens, b.labels, s);
        eager.zero_grad(s);
        eager.forward(s);
        eager.backward(s);
        eager.optimizer_step(s, {});
        graphed.set_batch(b.tokens, b.labels, s);
        exec.launch(s);
        CHECK(eager.loss(s) == graphed.loss(s));
    }
    const auto& pe = eager.parameters();
    const auto& pg = graphed.parameters();
    CHECK(support::same_bits(support::download(pe.grads(), pe.total(), s), support::download(pg.grads(), pg.total(), s)));
    CHECK(support::same_bits(support::download(pe.masters(), pe.total(), s), support::download(pg.masters(), pg.total(), s)));
    CHECK(support::same_bits(support::download(pe.first_moment(), pe.total(), s), support::download(pg.first_moment(), pg.total(), s)));
}

TEST_CASE("dropless MoE is not capturable, and the error names the stage") {
    const auto cfg = small("E", gpt::moe_mode::dropless, 1.0);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 3);
    m.set_batch(b.tokens, b.labels, s);
    s.synchronize();
    std::string message;
    try {
        auto g = capscope::cuda::capture(s, [&](cudaStream_t cs) { m.forward(cs); });
    } catch (const capscope::cuda::error& e) {
        message = e.what();
        CHECK(e.scope() == "layer0.moe_preprocess");
        CHECK(e.call() == "cudaStreamSynchronize(s)");
    }
    std::printf("  dropless capture error: %s\n", message.c_str());
    CHECK(message.find("in scope 'layer0.moe_preprocess'") != std::string::npos);
    // The stream is usable again, and eager dropless still works.
    m.forward(s);
    CHECK(std::isfinite(m.loss(s)));
}

// Not run under compute-sanitizer, whose own bookkeeping allocates device memory.
TEST_CASE("a step allocates no device memory") {
    const auto cfg = small("DEMD", gpt::moe_mode::dropless, 1.0);
    capscope::cuda::stream s;
    gpt::gpt_model<float> m(cfg, s);
    const auto b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 4);
    m.set_batch(b.tokens, b.labels, s);
    m.zero_grad(s);
    m.forward(s);
    m.backward(s);
    m.optimizer_step(s, {});
    s.synchronize();
    std::size_t free_before = 0, free_after = 0, total = 0;
    CAPSCOPE_CHECK(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 5; ++i) { // new batches: dropless expert GEMM shapes change every step
        const auto next = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 40 + i);
        m.set_batch(next.tokens, next.labels, s);
        m.zero_grad(s);
        m.forward(s);
        m.backward(s);
        m.optimizer_step(s, {});
    }
    s.synchronize();
    CAPSCOPE_CHECK(cudaMemGetInfo(&free_after, &total));
    CHECK(free_after == free_before);
}
