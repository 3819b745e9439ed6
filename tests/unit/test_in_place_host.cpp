// in_place_runner on the host (no GPU: its eager steps make no CUDA call of their own): a
// loop-first trainer's marks run in the trainer's order through the recording step and the
// warmup; a step whose marks differ is refused before the region runs, naming the first
// difference; record(body) plans without running the regions' code (planning needs no GPU); and
// the recorded program plans as the same program declared.

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>

#include "fake_stream.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace capscope;

namespace {

using host_tests::fake_stream;

//! A trainer that owns its loops and logs what its regions' code does.
struct loop_first {
    std::vector<std::string> log;
    int layers = 3, microbatches = 2;
    bool skip_layer1 = false;
    template <class Step>
    void train_step(Step& step) {
        step.run({.kind = stage_kind_id("zero_grads")}, [&](cudaStream_t) { log.push_back("zero"); });
        for (int mb = 0; mb < microbatches; ++mb) {
            step.microbatch();
            for (int l = 0; l < layers; ++l)
                if (!skip_layer1 || l != 1)
                    step.forward({.layer = l, .kind = stage_kind_id("block")}, [&](cudaStream_t) { log.push_back("f" + std::to_string(l)); });
            for (int l = layers - 1; l >= 0; --l)
                step.backward({.layer = l, .kind = stage_kind_id("block")}, [&](cudaStream_t) { log.push_back("b" + std::to_string(l)); });
        }
        step.run({.kind = stage_kind::optimizer}, [&](cudaStream_t) { log.push_back("update"); });
    }
};

const std::vector<std::string> one_step = {"zero", "f0", "f1", "f2", "b2", "b1", "b0", "f0", "f1", "f2", "b2", "b1", "b0", "update"};

using local = config<impl::lazy_per_layer, capture_regions<"block">, warmup_steps<3>, capture_doctor_off>;

} // namespace

TEST_CASE("in place, on the host: the recording step and the warmup run the regions' code in the trainer's order") {
    loop_first t;
    in_place_runner<local> cap;
    CHECK_FALSE(cap.recorded());
    for (int i = 0; i < 3; ++i) { // all eager: the recording step and two more of the warmup
        t.log.clear();
        in_place_step step = cap.step(fake_stream);
        t.train_step(step);
        step.end();
        CHECK_MESSAGE(t.log == one_step, "step ", i);
    }
    CHECK(cap.recorded());
    CHECK(cap.counters().captures == 0);
    CHECK(cap.plan().graph_count == 12); // 3 blocks x 2 passes x 2 microbatches (the marks declare no buffers)
    const std::string text = cap.plan_text();
    CHECK(text.find("graph g0     layer0.block") != std::string::npos);
    CHECK(text.find("eager        zero_grads") != std::string::npos);
}

TEST_CASE("in place, on the host: a step whose marks differ is refused before that region runs, naming the first difference") {
    loop_first t;
    in_place_runner<local> cap;
    for (int i = 0; i < 2; ++i) {
        in_place_step step = cap.step(fake_stream);
        t.train_step(step);
        step.end();
    }
    t.skip_layer1 = true;
    t.log.clear();
    std::string error;
    try {
        in_place_step step = cap.step(fake_stream);
        t.train_step(step);
        step.end();
    } catch (const std::logic_error& e) {
        error = e.what();
    }
    CHECK(error.find("step 3: the trainer's code reached region 'layer2.block' (forward, microbatch 0), where the recorded step has "
                     "'layer1.block' (forward, microbatch 0)") != std::string::npos);
    CHECK(t.log == std::vector<std::string>{"zero", "f0"}); // layer 2's code did not run
    // A step that ends early, and marks outside a step, are refused too.
    t.skip_layer1 = false;
    std::string early;
    try {
        in_place_step step = cap.step(fake_stream);
        step.run({.kind = stage_kind_id("zero_grads")}, [](cudaStream_t) {});
        step.end();
    } catch (const std::logic_error& e) {
        early = e.what();
    }
    CHECK(early.find("the step ended before region 'embedding'") == std::string::npos);
    CHECK(early.find("the step ended before region 'layer0.block' (forward, microbatch 0)") != std::string::npos);
    in_place_step ended = cap.step(fake_stream);
    t.train_step(ended);
    ended.end();
    CHECK_THROWS_WITH_AS(ended.microbatch(), doctest::Contains("this in_place_step has ended"), std::logic_error);
}

TEST_CASE("in place, on the host: record(body) plans without running the regions' code, as the same program declared") {
    loop_first t;
    in_place_runner<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>> cap;
    cap.record([&](in_place_step& step) { t.train_step(step); });
    CHECK(t.log.empty()); // no region's code ran
    CHECK(cap.recorded());
    CHECK(cap.plan().graph_count == 1);
    // The same stages declared (with functions of their own) plan alike.
    training_program declared = cap.program();
    runner<config<impl::whole_iteration, no_nan_check, warmup_steps<2>>> r(declared);
    CHECK(r.plan_text() == cap.plan_text());
    // A plan error is the recording's: a config that selects a region the trainer never marks.
    in_place_runner<config<impl::lazy_per_layer, capture_regions<"attention_of_another_model">>> wrong;
    CHECK_THROWS_WITH_AS(wrong.record([&](in_place_step& step) { t.train_step(step); }), doctest::Contains("attention_of_another_model"), plan_error);
}

TEST_CASE("in place, on the host: later marks are held against the marks, not against what a composition added to the stages") {
    // with_offload adds each kept tensor to its producer's outputs; a composer here does the same.
    char extra = 0;
    loop_first t;
    auto compose = [&](training_program p) {
        for (auto& list : p.microbatches)
            for (stage& s : list)
                if (s.layer == 1) s.outputs.push_back({"added by the composition", &extra, 1});
        return p;
    };
    in_place_runner<local> cap({}, {}, compose);
    cap.record([&](in_place_step& step) { t.train_step(step); });
    for (int i = 0; i < 2; ++i) { // eager: the warmup (a recording pass of its own is no step)
        t.log.clear();
        in_place_step step = cap.step(fake_stream);
        t.train_step(step);
        step.end();
        CHECK(t.log == one_step);
    }
    CHECK(cap.program().microbatches[0][1].outputs.size() == 1);
    // An earlier in_place_step can no longer act once a later step began (the third warmup step).
    in_place_step first = cap.step(fake_stream);
    in_place_step second = cap.step(fake_stream);
    CHECK_THROWS_WITH_AS(first.microbatch(), doctest::Contains("belongs to an earlier step"), std::logic_error);
    t.train_step(second);
    second.end();
}
