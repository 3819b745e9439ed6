// Activation offload on the example model's pipelined passes (gpt::pipeline_model with an
// activation_offload), one process per GPU (`mpirun -np 2` or 4; one rank skips). Each rank holds
// two dense layers; the attention and MLP inputs are offloaded through a ring of one slot, so a
// backward pass copies the first layer's kept tensors to the host after recomputing them, and
// back once the second layer's backward is done. Under every impl (the copies inside the pass
// graphs, or inside the whole-step graph):
// - bitwise equal to the eager pipeline with the same offload, and to the eager pipeline without
//   offload (the copies are exact and the recomputation is the same);
// - the chunks' kept tensors take less device memory, and host memory holds the copies;
// - with a backward hook that clears gradients, offloaded = not offloaded (hooks beside the copies).
// Broken on purpose (CAPSCOPE_BREAK=skip_pass_copy_back: no copy back) the gradients are computed
// from the other layer's tensors, and the results differ.
// And on one GPU, in any run (no sends or receives): a policy under which one virtual stage moves
// nothing is refused by the constructor of every rank alike, naming that stage, not by that
// stage's rank only (the others would wait for it forever in their first receive).

#include "model_pipeline_support.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/cuda/stream.hpp>
#include <capscope/hooks.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;
using support::comm;
namespace pl = capscope::pipeline;

namespace {

constexpr int steps = 3, microbatches = 4;
using model_pipeline::impl;
using model_pipeline::impl_names;

using model_pipeline::all_ranks;

gpt::activation_offload attention_and_mlp_inputs() {
    gpt::activation_offload o;
    o.policy.enabled = true;
    o.policy.modules = {offload_module::qkv_linear, offload_module::core_attn, offload_module::attn_proj, offload_module::mlp_norm};
    o.policy.min_tensor_size = 1; // the test model's tensors are small
    o.ring.slots = 1;
    return o;
}

struct offloaded_run {
    std::vector<float> masters;
    std::size_t device_bytes = 0, host_bytes = 0;
};

//! With `hooked`, a backward hook clears each layer's gradients after its backward, except the
//! last layer's: with the copies in the same lists, the hooks must still run where they belong.
offloaded_run train(const pl::schedule_shape& shape, impl how, bool offloading, cudaStream_t s, bool hooked = false) {
    const int last_layer = shape.layers - 1;
    const hook_pipeline hooks{hook<hook_phase::backward, capturable>("clear", [last_layer](backward_context& x) {
        if (x.layer() != last_layer)
            for (const tensor_ref& g : x.gradients()) CAPSCOPE_CHECK(cudaMemsetAsync(g.data, 0, g.bytes, x.stream()));
    })}; // outlives the model
    gpt::model_config cfg = support::small_model(std::string(std::size_t(shape.layers), 'D').c_str(), gpt::moe_mode::drop_and_pad, 1.25);
    cfg.batch = 2;
    cfg.microbatches = microbatches;
    gpt::pipeline_model<float> model(cfg, shape, comm().rank(), s, gpt::pipeline_slots::planned,
                                     offloading ? attention_and_mlp_inputs() : gpt::activation_offload{});
    if (hooked) model.set_hooks(hooks);
    model_pipeline::run_steps(
        model, comm(), shape, how, steps, s,
        [&](int t) {
            for (int mb = 0; mb < microbatches; ++mb) {
                const support::batch b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 6100u + std::uint64_t(t % 2) * 131u + std::uint64_t(mb));
                model.set_batch(mb, b.tokens, b.labels, s);
            }
        },
        [](int) {});
    return {model_pipeline::masters_of(model, s), model.activation_device_bytes(), model.activation_host_bytes()};
}

} // namespace

TEST_CASE("the example model pipelined with activation offload: every impl bitwise equal to its eager pipeline, with and without offload") {
    if (comm().size() < 2) {
        MESSAGE("one rank: the pipeline needs mpirun -np 2 or more");
        return;
    }
    const pl::schedule_shape shape{.kind = pl::schedule_kind::one_f_one_b, .ranks = comm().size(), .layers = 2 * comm().size()};
    cuda::stream s;
    const offloaded_run plain = train(shape, model_pipeline::impl::eager, false, s);
    const offloaded_run eager = train(shape, model_pipeline::impl::eager, true, s);
    const bool same_as_plain = all_ranks(plain.masters == eager.masters);
    std::string verdicts;
    bool every_impl = true;
    for (model_pipeline::impl how : {model_pipeline::impl::local, model_pipeline::impl::transformer_engine, model_pipeline::impl::full_iteration}) {
        const bool same = all_ranks(train(shape, how, true, s).masters == eager.masters);
        verdicts += std::string(", eager ") + (same ? "=" : "!=") + " " + model_pipeline::impl_names[int(how)];
        every_impl = every_impl && same;
    }
    const bool smaller = all_ranks(eager.device_bytes < plain.device_bytes && eager.host_bytes > 0);
    // Hooks beside the copies: offloaded with hooks = not offloaded with hooks, eager and whole-step.
    const std::vector<float> hooked_plain = train(shape, model_pipeline::impl::eager, false, s, true).masters;
    // Every rank trains every model (their sends and receives must match): no short-circuit.
    const std::vector<float> hooked_eager = train(shape, model_pipeline::impl::eager, true, s, true).masters;
    const std::vector<float> hooked_whole = train(shape, model_pipeline::impl::full_iteration, true, s, true).masters;
    const bool hooks_compose = all_ranks(hooked_eager == hooked_plain && hooked_whole == hooked_plain && hooked_plain != plain.masters);
    std::printf("example model pipelined with activation offload, 1f1b, %d ranks, rank %d, 2 dense layers a rank, %d microbatches, %d steps: "
                "kept tensors %.3f -> %.3f MiB on the device, %.3f MiB on the host; offloaded %s not offloaded%s; with a clearing backward hook, "
                "offloaded (eager, full_iteration) %s not offloaded\n",
                shape.ranks, comm().rank(), microbatches, steps, double(plain.device_bytes) / 1048576.0, double(eager.device_bytes) / 1048576.0,
                double(eager.host_bytes) / 1048576.0, same_as_plain ? "= bitwise" : "DIFFERS FROM", verdicts.c_str(),
                hooks_compose ? "= bitwise" : "DIFFERS FROM");
    std::fflush(stdout);
    CHECK(same_as_plain);
    CHECK_MESSAGE(every_impl, "an impl with offload differs from the eager pipeline with offload");
    CHECK(smaller);
    CHECK(hooks_compose);
}

TEST_CASE("the example model pipelined with activation offload: a virtual stage that moves nothing is refused by every rank alike") {
    comm(); // this rank's GPU, before any stream (mpi_support.hpp); the models below send and receive nothing
    // Stage 0 (layers 0-1, dense) moves layer 0's tensors through the ring of one slot; stage 1
    // (layers 2-3, Mamba) keeps nothing the policy offloads. Planned per chunk only, rank 0 would
    // construct, and then wait for rank 1, which throws, in its first receive.
    gpt::model_config cfg = support::small_model("DDMM", gpt::moe_mode::drop_and_pad, 1.25);
    cfg.batch = 2;
    cfg.microbatches = microbatches;
    const pl::schedule_shape shape{.kind = pl::schedule_kind::one_f_one_b, .ranks = 2, .layers = 4};
    cuda::stream s;
    std::vector<std::string> messages;
    for (int rank : {0, 1}) {
        std::string message = "(constructed)";
        try {
            gpt::pipeline_model<float> model(cfg, shape, rank, s, gpt::pipeline_slots::planned, attention_and_mlp_inputs());
        } catch (const std::invalid_argument& e) {
            message = e.what();
        }
        std::printf("rank %d of 2, pattern DDMM, offloading attention and MLP inputs: %s\n", rank, message.c_str());
        CHECK_MESSAGE(message.find("activation offload refuses virtual stage 1 (layers 2-3, on rank 1)") != std::string::npos, "rank ", rank,
                      ": ", message);
        messages.push_back(message);
    }
    std::fflush(stdout);
    CHECK_MESSAGE(messages[0] == messages[1], "the ranks refuse with other messages");
}
