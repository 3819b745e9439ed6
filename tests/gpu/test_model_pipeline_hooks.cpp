// Hooks on the example model's pipelined passes (gpt::pipeline_model::set_hooks,
// capscope/hooks/with_pass_hooks.hpp), one process per GPU (`mpirun -np 2` or 4; one rank skips).
// A hook of each phase counts its calls per layer on the device, a backward hook clears layer 1's
// gradients after each of its backwards, and a step hook of each point counts the steps. Under
// every impl (the hooks inside the pass graphs, or inside the whole-step graph):
// - the masters are bitwise equal to the eager pipeline with the same hooks, and differ from the
//   run without hooks (the clearing hook took effect);
// - each layer this rank holds counts 2M forward_pre calls a step (the forward pass and the
//   backward pass's recomputed forward), M forward, M backward_pre and M backward calls; the
//   others count none; each step hook counts one a step;
// - layer 1's gradients are zero after the step.
// Broken on purpose (CAPSCOPE_BREAK=recompute_forward_hooks) the forward hooks count 2M.

#include "engine_kernels.hpp"
#include "model_pipeline_support.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/cuda/stream.hpp>
#include <capscope/hooks.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace capscope;
using support::comm;
namespace pl = capscope::pipeline;

namespace {

constexpr int steps = 3, microbatches = 4, model_layers = 4, cleared_layer = 1;
using model_pipeline::impl;
using model_pipeline::impl_names;

struct hooked_run {
    std::vector<float> masters;
    std::vector<int> counts;        //!< [layer * 4 + phase], then the two step hooks'
    bool cleared_layer_zero = true; //!< layer 1's gradients after the last step are all zero (where this rank holds it)
};

bool all_ranks(bool mine) {
    int ok = mine ? 1 : 0, all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all == 1;
}

hooked_run train(const pl::schedule_shape& shape, impl how, bool hooked, cudaStream_t s) {
    gpt::model_config cfg = support::small_model("DEMD", gpt::moe_mode::drop_and_pad, 1.25);
    cfg.batch = 2;
    cfg.microbatches = microbatches;
    gpt::pipeline_model<float> model(cfg, shape, comm().rank(), s);
    cuda::device_buffer<int> counts(model_layers * 4 + 2);
    counts.fill_bytes(0, s);
    int* const c = counts.data();
    const hook_pipeline hooks{
        hook<hook_phase::forward_pre, capturable>("count forward_pre", [c](forward_pre_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 0, x.stream()); }),
        hook<hook_phase::forward, capturable>("count forward", [c](forward_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 1, x.stream()); }),
        hook<hook_phase::backward_pre, capturable>("count backward_pre", [c](backward_pre_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 2, x.stream()); }),
        hook<hook_phase::backward, capturable>("count backward", [c](backward_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 3, x.stream()); }),
        hook<hook_phase::backward, capturable, of_layers<cleared_layer>>("clear", [](backward_context& x) {
            for (const tensor_ref& g : x.gradients()) CAPSCOPE_CHECK(cudaMemsetAsync(g.data, 0, g.bytes, x.stream()));
        }),
        on_step<step_point::before_optimizer, capturable>("count before", [c](step_context& x) { engine_kernels::add_one(c + model_layers * 4, x.stream()); }),
        on_step<step_point::after_optimizer, capturable>("count after", [c](step_context& x) { engine_kernels::add_one(c + model_layers * 4 + 1, x.stream()); }),
    };
    if (hooked) model.set_hooks(hooks);
    model_pipeline::run_steps(
        model, comm(), shape, how, steps, s,
        [&](int t) {
            for (int mb = 0; mb < microbatches; ++mb) {
                const support::batch b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 5100u + std::uint64_t(t % 2) * 131u + std::uint64_t(mb));
                model.set_batch(mb, b.tokens, b.labels, s);
            }
        },
        [](int) {});
    hooked_run out;
    out.counts.resize(counts.size());
    CAPSCOPE_CHECK(cudaMemcpyAsync(out.counts.data(), c, counts.bytes(), cudaMemcpyDeviceToHost, s));
    for (int k = 0; k < model.chunks(); ++k) {
        const gpt::parameter_store<float>& p = model.parameters(k);
        std::vector<float> all(p.total());
        CAPSCOPE_CHECK(cudaMemcpyAsync(all.data(), p.masters(), all.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        out.masters.insert(out.masters.end(), all.begin(), all.end());
        if (model.first_layer(k) <= cleared_layer && cleared_layer < model.end_layer(k)) {
            const tensor_ref g = p.layer_gradients(cleared_layer);
            std::vector<float> grads(g.bytes / sizeof(float));
            CAPSCOPE_CHECK(cudaMemcpyAsync(grads.data(), g.data, g.bytes, cudaMemcpyDeviceToHost, s));
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            out.cleared_layer_zero = std::all_of(grads.begin(), grads.end(), [](float v) { return v == 0.f; });
        }
    }
    return out;
}

//! What the counts must be on this rank: 2M, M, M, M a step for the layers it holds, 1 a step per step hook.
std::vector<int> expected_counts(const pl::schedule_shape& shape) {
    std::vector<int> want(model_layers * 4 + 2, 0);
    const int per_chunk = shape.layers_per_chunk();
    for (int chunk = 0; chunk < shape.virtual_stages; ++chunk)
        for (int l = shape.stage_of(comm().rank(), chunk) * per_chunk, e = l + per_chunk; l < e; ++l) {
            want[std::size_t(l * 4 + 0)] = 2 * microbatches * steps;
            for (int phase = 1; phase < 4; ++phase) want[std::size_t(l * 4 + phase)] = microbatches * steps;
        }
    want[model_layers * 4] = want[model_layers * 4 + 1] = steps;
    return want;
}

std::string counts_text(const std::vector<int>& counts) {
    std::string out;
    for (int l = 0; l < model_layers; ++l) {
        if (counts[std::size_t(l * 4)] == 0) continue;
        out += (out.empty() ? "" : ", ") + std::string("layer ") + std::to_string(l) + " " + std::to_string(counts[std::size_t(l * 4)]);
        for (int phase = 1; phase < 4; ++phase) out += "/" + std::to_string(counts[std::size_t(l * 4 + phase)]);
    }
    return out + ", step hooks " + std::to_string(counts[model_layers * 4]) + "/" + std::to_string(counts[model_layers * 4 + 1]);
}

void check_hooks(const pl::schedule_shape& shape) {
    cuda::stream s;
    const hooked_run plain = train(shape, impl::eager, false, s);
    const hooked_run eager = train(shape, impl::eager, true, s);
    const std::vector<int> want = expected_counts(shape);
    std::string verdicts;
    bool every_impl = true, counts_right = eager.counts == want, cleared = eager.cleared_layer_zero;
    for (impl how : {impl::local, impl::transformer_engine, impl::full_iteration}) {
        const hooked_run run = train(shape, how, true, s);
        const bool same = all_ranks(run.masters == eager.masters);
        verdicts += std::string(", eager ") + (same ? "=" : "!=") + " " + impl_names[int(how)];
        every_impl = every_impl && same;
        if (run.counts != want) {
            counts_right = false;
            verdicts += " (counts " + counts_text(run.counts) + ")";
        }
        cleared = cleared && run.cleared_layer_zero;
    }
    const bool effect = !all_ranks(plain.masters == eager.masters);
    counts_right = all_ranks(counts_right);
    cleared = all_ranks(cleared);
    std::printf("example model pipelined with hooks, %s, %d ranks%s, rank %d: counts forward_pre/forward/backward_pre/backward %s (%s)%s; "
                "hooks change the result: %s; layer %d's gradients cleared: %s\n",
                std::string(pl::name_of(shape.kind)).c_str(), shape.ranks,
                shape.virtual_stages > 1 ? (" x " + std::to_string(shape.virtual_stages) + " chunks").c_str() : "", comm().rank(),
                counts_text(eager.counts).c_str(), counts_right ? "as expected under every impl" : "NOT as expected", verdicts.c_str(),
                effect ? "yes" : "NO", cleared_layer, cleared ? "yes" : "NO");
    std::fflush(stdout);
    CHECK_MESSAGE(every_impl, "an impl with hooks differs from the eager pipeline with hooks");
    CHECK(counts_right);
    CHECK(effect);
    CHECK(cleared);
}

} // namespace

TEST_CASE("the example model pipelined with hooks: each phase where it belongs, under every impl") {
    if (comm().size() < 2) {
        MESSAGE("one rank: the pipeline needs mpirun -np 2 or more");
        return;
    }
    // The hook's kernel, loaded before any receive runs (see gpt::pipeline_model::set_hooks).
    {
        cuda::stream s;
        cuda::device_buffer<int> scratch(1);
        engine_kernels::add_one(scratch.data(), s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    }
    // The world is one pipeline: 2 ranks (1F1B, and interleaved with 2 chunks a rank), or 4 (1F1B, a layer a rank).
    const int ranks = comm().size();
    if (model_layers % ranks != 0) {
        MESSAGE("hooks: the 4-layer pattern does not split over " << ranks << " ranks");
        return;
    }
    check_hooks({.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = model_layers});
    if (model_layers % (2 * ranks) == 0)
        check_hooks({.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = model_layers});
}
