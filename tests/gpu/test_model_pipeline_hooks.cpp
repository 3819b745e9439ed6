// Hooks on the example model's pipelined passes (gpt::pipeline_model::set_hooks,
// capscope/hooks/with_pass_hooks.hpp), one process per GPU (`mpirun -np 2` or 4; one rank skips).
// A hook of each phase counts its calls per layer on the device, a backward hook clears layer 1's
// gradients after each of its backwards, and the before_optimizer step hook clears layer 3's once
// a step; both step hooks count the steps. Under every impl (the hooks inside the pass graphs, or
// inside the whole-step graph):
// - the masters are bitwise equal to the eager pipeline with the same hooks, and differ from the
//   run without hooks (the clearing hooks took effect);
// - they equal a run that clears layer 3 in a backward hook instead: the step hook runs after
//   every backward and before AdamW;
// - each layer this rank holds counts 2M forward_pre calls a step (the forward pass and the
//   backward pass's recomputed forward), M forward, M backward_pre and M backward calls; the
//   others count none; each step hook counts one a step;
// - layers 1 and 3's gradients are zero after the step.
// And with the microbatch count changing every step (8, 12, 16), eager = phase graphs with the
// hooks, the counts those of the steps' counts; set_hooks after a step is refused.
// Broken on purpose (CAPSCOPE_BREAK=recompute_forward_hooks) the forward hooks count 2M.

#include "engine_kernels.hpp"
#include "model_pipeline_support.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/cuda/stream.hpp>
#include <capscope/hooks.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace capscope;
using support::comm;
namespace pl = capscope::pipeline;

namespace {

constexpr int steps = 3, microbatches = 4, model_layers = 4;
using model_pipeline::impl;
using model_pipeline::impl_names;

//! How layer 3's gradients are cleared: by a backward hook after each of its backwards, or once,
//! by the before_optimizer step hook. The two must give the same bits: the step hook runs after
//! every backward and before AdamW.
enum class clear_layer3 { in_backward, before_optimizer };

//! The hooks: one of each phase counting its calls per layer ([layer * 4 + phase]), a backward
//! hook clearing layer 1's gradients (and layer 3's, in_backward), a before_optimizer step hook
//! counting (and clearing layer 3's, before_optimizer), an after_optimizer one counting.
auto make_hooks(int* c, clear_layer3 how) {
    const auto clear = [](const tensor_ref& g, cudaStream_t s) { CAPSCOPE_CHECK(cudaMemsetAsync(g.data, 0, g.bytes, s)); };
    return hook_pipeline{
        hook<hook_phase::forward_pre, capturable>("count forward_pre", [c](forward_pre_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 0, x.stream()); }),
        hook<hook_phase::forward, capturable>("count forward", [c](forward_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 1, x.stream()); }),
        hook<hook_phase::backward_pre, capturable>("count backward_pre", [c](backward_pre_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 2, x.stream()); }),
        hook<hook_phase::backward, capturable>("count backward", [c](backward_context& x) { engine_kernels::add_one(c + x.layer() * 4 + 3, x.stream()); }),
        hook<hook_phase::backward, capturable, of_layers<1, 3>>("clear", [how, clear](backward_context& x) {
            if (x.layer() == 1 || how == clear_layer3::in_backward)
                for (const tensor_ref& g : x.gradients()) clear(g, x.stream());
        }),
        on_step<step_point::before_optimizer, capturable>("count and clear", [c, how, clear](step_context& x) {
            engine_kernels::add_one(c + model_layers * 4, x.stream());
            if (how == clear_layer3::before_optimizer)
                for (const tensor_ref& g : x.layers()[3].gradients) clear(g, x.stream()); // empty where another rank holds layer 3
        }),
        on_step<step_point::after_optimizer, capturable>("count after", [c](step_context& x) { engine_kernels::add_one(c + model_layers * 4 + 1, x.stream()); }),
    };
}

struct hooked_run {
    std::vector<float> masters;
    std::vector<int> counts;    //!< [layer * 4 + phase], then the two step hooks'
    bool cleared_zero = true;   //!< layers 1 and 3's gradients after the last step are all zero, where this rank holds them
};

using model_pipeline::all_ranks;

gpt::model_config hooked_model(int mbs) {
    gpt::model_config cfg = support::small_model("DEMD", gpt::moe_mode::drop_and_pad, 1.25);
    cfg.batch = 2;
    cfg.microbatches = mbs;
    return cfg;
}

void set_batches(gpt::pipeline_model<float>& model, int step, int mbs, cudaStream_t s) {
    const gpt::model_config& cfg = model.config();
    for (int mb = 0; mb < mbs; ++mb) {
        const support::batch b = support::random_batch(cfg.batch, cfg.seq_len, cfg.vocab, 5100u + std::uint64_t(step % 2) * 131u + std::uint64_t(mb));
        model.set_batch(mb, b.tokens, b.labels, s);
    }
}

hooked_run result_of(const gpt::pipeline_model<float>& model, const cuda::device_buffer<int>& counts, cudaStream_t s) {
    hooked_run out;
    out.counts.resize(counts.size());
    CAPSCOPE_CHECK(cudaMemcpyAsync(out.counts.data(), counts.data(), counts.bytes(), cudaMemcpyDeviceToHost, s));
    out.masters = model_pipeline::masters_of(model, s);
    for (int k = 0; k < model.chunks(); ++k) {
        const gpt::parameter_store<float>& p = model.parameters(k);
        for (int cleared : {1, 3}) {
            if (cleared < model.first_layer(k) || cleared >= model.end_layer(k)) continue;
            const tensor_ref g = p.layer_gradients(cleared);
            std::vector<float> grads(g.bytes / sizeof(float));
            CAPSCOPE_CHECK(cudaMemcpyAsync(grads.data(), g.data, g.bytes, cudaMemcpyDeviceToHost, s));
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
            out.cleared_zero = out.cleared_zero && std::all_of(grads.begin(), grads.end(), [](float v) { return v == 0.f; });
        }
    }
    return out;
}

hooked_run train(const pl::schedule_shape& shape, impl how, std::optional<clear_layer3> hooked, cudaStream_t s) {
    cuda::device_buffer<int> counts(model_layers * 4 + 2);
    counts.fill_bytes(0, s);
    const auto hooks = make_hooks(counts.data(), hooked.value_or(clear_layer3::in_backward)); // outlives the model
    gpt::pipeline_model<float> model(hooked_model(microbatches), shape, comm().rank(), s);
    if (hooked) model.set_hooks(hooks);
    model_pipeline::run_steps(model, comm(), shape, how, steps, s, [&](int t) { set_batches(model, t, microbatches, s); }, [](int) {});
    return result_of(model, counts, s);
}

//! What the counts must be on this rank after steps of `counts` microbatches: 2M, M, M, M a step
//! for the layers it holds, 1 a step per step hook.
std::vector<int> expected_counts(const pl::schedule_shape& shape, const std::vector<int>& step_microbatches) {
    int total = 0;
    for (int m : step_microbatches) total += m;
    std::vector<int> want(model_layers * 4 + 2, 0);
    const int per_chunk = shape.layers_per_chunk();
    for (int chunk = 0; chunk < shape.virtual_stages; ++chunk)
        for (int l = shape.stage_of(comm().rank(), chunk) * per_chunk, e = l + per_chunk; l < e; ++l) {
            want[std::size_t(l * 4 + 0)] = 2 * total;
            for (int phase = 1; phase < 4; ++phase) want[std::size_t(l * 4 + phase)] = total;
        }
    want[model_layers * 4] = want[model_layers * 4 + 1] = int(step_microbatches.size());
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
    const hooked_run plain = train(shape, impl::eager, std::nullopt, s);
    const hooked_run eager = train(shape, impl::eager, clear_layer3::before_optimizer, s);
    const hooked_run in_backward = train(shape, impl::eager, clear_layer3::in_backward, s);
    const std::vector<int> want = expected_counts(shape, std::vector<int>(steps, microbatches));
    std::string verdicts;
    bool every_impl = true, counts_right = eager.counts == want, cleared = eager.cleared_zero;
    for (impl how : {impl::local, impl::transformer_engine, impl::full_iteration}) {
        const hooked_run run = train(shape, how, clear_layer3::before_optimizer, s);
        const bool same = all_ranks(run.masters == eager.masters);
        verdicts += std::string(", eager ") + (same ? "=" : "!=") + " " + impl_names[int(how)];
        every_impl = every_impl && same;
        if (run.counts != want) {
            counts_right = false;
            verdicts += " (counts " + counts_text(run.counts) + ")";
        }
        cleared = cleared && run.cleared_zero;
    }
    const bool effect = !all_ranks(plain.masters == eager.masters);
    const bool step_hook_placed = all_ranks(in_backward.masters == eager.masters);
    counts_right = all_ranks(counts_right);
    cleared = all_ranks(cleared);
    std::printf("example model pipelined with hooks, %s, %d ranks%s, rank %d: counts forward_pre/forward/backward_pre/backward %s (%s)%s; "
                "hooks change the result: %s; layers 1 and 3's gradients cleared: %s; layer 3 cleared by the before_optimizer step hook "
                "%s by a backward hook\n",
                std::string(pl::name_of(shape.kind)).c_str(), shape.ranks,
                shape.virtual_stages > 1 ? (" x " + std::to_string(shape.virtual_stages) + " chunks").c_str() : "", comm().rank(),
                counts_text(eager.counts).c_str(), counts_right ? "as expected under every impl" : "NOT as expected", verdicts.c_str(),
                effect ? "yes" : "NO", cleared ? "yes" : "NO", step_hook_placed ? "= bitwise" : "DIFFERS FROM clearing it");
    std::fflush(stdout);
    CHECK_MESSAGE(every_impl, "an impl with hooks differs from the eager pipeline with hooks");
    CHECK(counts_right);
    CHECK(effect);
    CHECK(cleared);
    CHECK(step_hook_placed);
}

//! The microbatch count changing every step, eagerly and from phase graphs captured once, both
//! with the hooks: bitwise equal, and the counts those of the steps' counts.
void check_phased_hooks(const pl::schedule_shape& shape, const std::vector<int>& cycle) {
    cuda::stream s;
    cuda::device_buffer<int> eager_counts(model_layers * 4 + 2), graph_counts(model_layers * 4 + 2);
    eager_counts.fill_bytes(0, s);
    graph_counts.fill_bytes(0, s);
    const auto eager_hooks = make_hooks(eager_counts.data(), clear_layer3::before_optimizer);
    const auto graph_hooks = make_hooks(graph_counts.data(), clear_layer3::before_optimizer);
    const gpt::model_config cfg = hooked_model(*std::max_element(cycle.begin(), cycle.end()));
    gpt::pipeline_model<float> eager(cfg, shape, comm().rank(), s, gpt::pipeline_slots::phased), graphed(cfg, shape, comm().rank(), s, gpt::pipeline_slots::phased);
    eager.set_hooks(eager_hooks);
    graphed.set_hooks(graph_hooks);
    std::map<int, pipeline_p2p> programs;
    for (int m : cycle) programs.emplace(m, pipeline_p2p(comm(), shape, m));
    pipeline_phase_graphs phases(comm(), shape);
    std::vector<int> run;
    for (int t = 0; t < 2 * int(cycle.size()); ++t) {
        const int m = cycle[std::size_t(t) % cycle.size()];
        run.push_back(m);
        set_batches(eager, t, m, s);
        set_batches(graphed, t, m, s);
        eager.step(programs.at(m), s);
        if (t == 0) graphed.step(programs.at(m), s); // NCCL opens its connections on the first send: eagerly
        else graphed.step(phases, m, s);
    }
    const hooked_run a = result_of(eager, eager_counts, s), b = result_of(graphed, graph_counts, s);
    const std::vector<int> want = expected_counts(shape, run);
    const bool same = all_ranks(a.masters == b.masters), counts_right = all_ranks(a.counts == want && b.counts == want);
    // Too late: a graph captured from the passes holds them as they were.
    std::string refusal;
    try {
        eager.set_hooks(eager_hooks);
    } catch (const std::logic_error& e) {
        refusal = e.what();
    }
    std::printf("example model pipelined with hooks, %s phases, %d ranks, rank %d, microbatches cycled over %zu steps: eager %s phases; counts %s (%s); "
                "set_hooks after a step refused: %s\n",
                std::string(pl::name_of(shape.kind)).c_str(), shape.ranks, comm().rank(), run.size(), same ? "=" : "!=",
                counts_text(b.counts).c_str(), counts_right ? "as expected" : "NOT as expected", refusal.empty() ? "NO" : "yes");
    std::fflush(stdout);
    CHECK(same);
    CHECK(counts_right);
    CHECK(refusal.find("before the first step") != std::string::npos);
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
    check_phased_hooks({.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = model_layers}, {8, 12, 16});
    if (model_layers % (2 * ranks) == 0)
        check_hooks({.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = model_layers});
}
