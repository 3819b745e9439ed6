// Collectives by plan, on the host (issue: several GPUs, hardened): the buckets of a gradient
// reduction and the plan's fingerprint come from sizes and order alone, so two ranks whose
// allocators laid the same gradients out differently make the same calls and fingerprint alike,
// while ranks that would move different sizes do not. A tensor that is not a whole number of
// elements is refused, never cut short.

#include "fake_program.hpp"

#include <capscope/capscope.hpp>
#include <capscope/hooks.hpp>
#include <capscope/parallel/reduction_buckets.hpp>
#include <capscope/plan/fingerprint.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

using namespace capscope;

namespace {

//! The calls a reduction makes, as the data-parallel hooks make them: per bucket, each tensor's
//! element count (a bucket of several is one NCCL group).
std::vector<std::vector<std::size_t>> calls_of(const std::vector<tensor_ref>& tensors, std::size_t element, std::size_t bucket_bytes) {
    std::vector<std::vector<std::size_t>> out;
    for_each_reduction_bucket(std::span<const tensor_ref>(tensors), bucket_bytes, [&](std::size_t first, std::size_t last) {
        out.emplace_back();
        for (std::size_t i = first; i < last; ++i) out.back().push_back(tensors[i].bytes / element);
    });
    return out;
}

//! Gradients of these sizes: one after another in one arena (`packed`), or each in its own place,
//! in the other order, with gaps (`scattered`), as another rank's allocator might lay them out.
std::vector<tensor_ref> layout(const std::vector<std::size_t>& sizes, std::vector<char>& memory, bool packed) {
    std::size_t total = 0;
    for (std::size_t b : sizes) total += b + 64;
    memory.assign(total, 0);
    std::vector<tensor_ref> out(sizes.size());
    std::size_t at = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t i = packed ? k : sizes.size() - 1 - k;
        out[i] = {"grad" + std::to_string(i), memory.data() + at, sizes[i]};
        at += sizes[i] + (packed ? 0 : 64);
    }
    return out;
}

} // namespace

TEST_CASE("a reduction's buckets and calls come from sizes and order alone, whatever the layout") {
    const std::vector<std::size_t> sizes = {4096, 4096, 16384, 64, 1 << 20, 256};
    std::vector<char> a_memory, b_memory;
    const auto packed = layout(sizes, a_memory, true);
    const auto scattered = layout(sizes, b_memory, false);
    const auto a = calls_of(packed, 4, 32768), b = calls_of(scattered, 4, 32768);
    CHECK(a == b);
    // Consecutive tensors up to 32 KiB, a larger one alone: {4096, 4096, 16384, 64} bytes, {1 MiB}, {256}.
    CHECK(a == std::vector<std::vector<std::size_t>>{{1024, 1024, 4096, 16}, {262144}, {64}});
    // The old rule merged tensors adjacent in memory: the packed layout made one call for the first
    // bucket, the scattered one four, and two ranks with these layouts would have hung.
}

TEST_CASE("a tensor that is not a whole number of elements is refused with the fix") {
    const std::vector<tensor_ref> ragged = {{"layer0.grads", nullptr, 4096}, {"layer1.grads", nullptr, 4098}};
    try {
        require_whole_elements(ragged, 4, "step_gradient_all_reduce");
        FAIL("no error");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK(what.find("tensor 'layer1.grads' has 4098 bytes, not a whole number of 4-byte elements, so its last 2 bytes would not be reduced") !=
              std::string::npos);
        CHECK(what.find("-- fix:") != std::string::npos);
    }
    CHECK_NOTHROW(require_whole_elements(ragged, 2, "bf16"));
}

TEST_CASE("the plan's fingerprint covers sizes, not addresses") {
    auto fingerprint_of = [](fake::model& m, const std::vector<tensor_ref>& grads) {
        training_program p = m.program("DE", false, 1);
        stage reduce = m.make("grad all-reduce (outside the layers) (float32, avg)", -1, stage_kind::other, {}, &m.buffers[62]);
        reduce.backward = {};
        reduce.lane = 1;
        reduce.inputs = grads;
        reduce.outputs = grads;
        p.step_end.insert(p.step_end.begin(), reduce);
        const training_plan plan = make_training_plan(capture_scope_of<config<impl::whole_iteration, no_nan_check>>, 1, p);
        return plan_fingerprint(plan, p);
    };
    const std::vector<std::size_t> sizes = {4096, 1024, 256};
    std::vector<char> a_memory, b_memory, c_memory;
    fake::model a, b, c; // three ranks: their stages and buffers lie at other addresses too
    const auto fa = fingerprint_of(a, layout(sizes, a_memory, true));
    const auto fb = fingerprint_of(b, layout(sizes, b_memory, false));
    CHECK(fa == fb);
    // A rank whose reduction would move other sizes: the plan's text is the same, the fingerprint not.
    const auto fc = fingerprint_of(c, layout({4096, 1024, 512}, c_memory, true));
    CHECK(fa != fc);
}

TEST_CASE("the plan's fingerprint covers what a layer's backward hook reduces") {
    // A reduction as a backward hook declares its gradients as the hook stage's backward buffers.
    auto fingerprint_of = [](std::size_t layer1_bytes) {
        fake::model m;
        static std::vector<char> memory(1 << 16);
        std::vector<tensor_ref> grads = {{"grad0", memory.data(), 4096}, {"grad1", memory.data() + 8192, layer1_bytes}};
        const std::vector<layer_tensors> tensors = {{{}, {&grads[0], 1}}, {{}, {&grads[1], 1}}};
        const hook_pipeline hooks{hook<hook_phase::backward, capturable>("grad all-reduce (float32, avg)", [](backward_context&) {})};
        const training_program p = with_hooks(m.program("DE", false, 1), hooks, tensors);
        const training_plan plan = make_training_plan(capture_scope_of<config<impl::whole_iteration, no_nan_check>>, 1, p);
        return plan_fingerprint(plan, p);
    };
    CHECK(fingerprint_of(1024) == fingerprint_of(1024));
    CHECK(fingerprint_of(1024) != fingerprint_of(2048));
}

namespace {
//! A reduction as the data-parallel hook is one, without NCCL: what decides its calls besides its
//! buffers is its bucket size, which it reports as the hook's collective_calls.
struct bucketed_reduction {
    std::size_t bucket_bytes;
    void operator()(backward_context&) const {}
    std::string collective_calls(int) const { return "buckets of " + std::to_string(bucket_bytes) + " bytes"; }
};
} // namespace

TEST_CASE("the plan's fingerprint covers what decides a hook's collective calls besides its buffers: a reduction's bucket size") {
    auto plan_of = [](std::size_t bucket_bytes, std::string* text) {
        fake::model m;
        static std::vector<char> memory(1 << 16);
        std::vector<tensor_ref> grads = {{"grad0", memory.data(), 4096}, {"grad1", memory.data() + 8192, 1024}};
        const std::vector<layer_tensors> tensors = {{{}, {&grads[0], 1}}, {{}, {&grads[1], 1}}};
        const hook_pipeline hooks{hook<hook_phase::backward, capturable, on_lane<1>, last_microbatch_only>("grad all-reduce (float32, avg)",
                                                                                                         bucketed_reduction{bucket_bytes})};
        const training_program p = with_hooks(m.program("DE", false, 1), hooks, tensors);
        const auto hooked = std::find_if(p.microbatches[0].begin(), p.microbatches[0].end(), [](const stage& s) { return s.added; });
        REQUIRE(hooked != p.microbatches[0].end());
        CHECK(hooked->collective_calls == "buckets of " + std::to_string(bucket_bytes) + " bytes");
        const training_plan plan = make_training_plan(capture_scope_of<config<impl::whole_iteration, no_nan_check>>, 1, p);
        *text = to_text(plan, p);
        return plan_fingerprint(plan, p);
    };
    std::string a_text, b_text, c_text;
    const auto a = plan_of(40 << 20, &a_text), b = plan_of(40 << 20, &b_text), c = plan_of(1 << 20, &c_text);
    CHECK(a == b);
    // Ranks whose reductions would group their calls differently: the same plan text, other fingerprints.
    CHECK(a_text == c_text);
    CHECK(a != c);
}
