// The example model pipelined (gpt/pipeline.hpp), one process per GPU (`mpirun -np 2` or 4; one
// rank skips): GPipe, 1F1B and interleaved 1F1B, dense, MoE and Mamba layers.
// - Every impl equals the eager pipeline (the same schedule, no graph) bit for bit on every rank:
//   losses, and every chunk's masters after the steps. full_iteration is the whole step (sends and
//   receives inside) captured as one graph; local and transformer_engine replay each pass from a
//   graph per chunk, direction and slot (pipeline_pass_graphs), captured lazily or ahead of time.
// - The eager pipeline equals one GPU training the whole model on the same microbatches (rank 0,
//   gpt_model, the same initial weights copied across), within a stated tolerance.

#include "model_pipeline_support.hpp"
#include "mpi_support.hpp"
#include "support.hpp"

#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <gpt/model.hpp>
#include <gpt/pipeline.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

using namespace capscope;
using support::comm;
namespace pl = capscope::pipeline;

namespace {

constexpr int steps = 3;

using model_pipeline::impl;
using model_pipeline::impl_names;

gpt::model_config pipelined_model(const std::string& pattern, int microbatches) {
    gpt::model_config c = support::small_model(pattern.c_str(), gpt::moe_mode::drop_and_pad, 1.25);
    c.batch = 2;
    c.microbatches = microbatches;
    return c;
}

//! Microbatch `mb`'s batch of step `step`: two sets in turn, so that a graph that kept a step's
//! tokens or labels would differ, and the loss falls from step 0 to step 2 (the same batches).
support::batch batch_of(const gpt::model_config& c, int step, int mb) {
    return support::random_batch(c.batch, c.seq_len, c.vocab, 7000u + std::uint64_t(step % 2) * 131u + std::uint64_t(mb));
}

//! What a run leaves: the loss of each step (on the last stage's rank; empty elsewhere) and every
//! chunk's parameters by name, fp32 masters.
struct trained {
    std::vector<float> losses;
    std::vector<std::pair<std::string, std::vector<float>>> masters;
};

std::vector<std::pair<std::string, std::vector<float>>> masters_of(const gpt::pipeline_model<float>& m, cudaStream_t s) {
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (int c = 0; c < m.chunks(); ++c) {
        const gpt::parameter_store<float>& p = m.parameters(c);
        std::vector<float> all(p.total());
        CAPSCOPE_CHECK(cudaMemcpyAsync(all.data(), p.masters(), all.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        for (const gpt::parameter_info& i : p.list())
            out.emplace_back(i.name, std::vector<float>(all.begin() + std::ptrdiff_t(i.offset), all.begin() + std::ptrdiff_t(i.offset + i.count)));
    }
    return out;
}

trained train(const gpt::model_config& cfg, const pl::schedule_shape& shape, impl how, cudaStream_t s,
              std::vector<std::pair<std::string, std::vector<float>>>* initial = nullptr) {
    gpt::pipeline_model<float> model(cfg, shape, comm().rank(), s);
    if (initial) *initial = masters_of(model, s);
    trained out;
    model_pipeline::run_steps(
        model, comm(), shape, how, steps, s,
        [&](int t) {
            for (int mb = 0; mb < cfg.microbatches; ++mb) {
                const support::batch b = batch_of(cfg, t, mb);
                model.set_batch(mb, b.tokens, b.labels, s);
            }
        },
        [&](int) {
            if (model.has_last_stage()) out.losses.push_back(model.loss(s));
        });
    out.masters = masters_of(model, s);
    return out;
}

using model_pipeline::all_ranks;

//! Every rank's (name, values) on rank 0, in rank order.
std::vector<std::pair<std::string, std::vector<float>>> gather_named(const std::vector<std::pair<std::string, std::vector<float>>>& mine) {
    std::string names;
    std::vector<float> values;
    std::vector<int> counts;
    for (const auto& [name, v] : mine) {
        names += name + '\n';
        counts.push_back(int(v.size()));
        values.insert(values.end(), v.begin(), v.end());
    }
    const int ranks = comm().size(), rank = comm().rank();
    auto gather = [&](const void* data, int n, MPI_Datatype type, std::size_t size, std::vector<char>& all, std::vector<int>& sizes) {
        sizes.assign(std::size_t(ranks), 0);
        CAPSCOPE_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
        std::vector<int> at(std::size_t(ranks), 0);
        int total = 0;
        for (int r = 0; r < ranks; ++r) at[std::size_t(r)] = total, total += sizes[std::size_t(r)];
        all.assign(std::size_t(total) * size, 0);
        CAPSCOPE_MPI_CHECK(MPI_Gatherv(data, n, type, all.data(), sizes.data(), at.data(), type, 0, MPI_COMM_WORLD));
    };
    std::vector<char> all_names, all_counts, all_values;
    std::vector<int> name_sizes, count_sizes, value_sizes;
    gather(names.data(), int(names.size()), MPI_CHAR, 1, all_names, name_sizes);
    gather(counts.data(), int(counts.size()), MPI_INT, sizeof(int), all_counts, count_sizes);
    gather(values.data(), int(values.size()), MPI_FLOAT, sizeof(float), all_values, value_sizes);
    std::vector<std::pair<std::string, std::vector<float>>> out;
    if (rank != 0) return out;
    const int* count = reinterpret_cast<const int*>(all_counts.data());
    const float* value = reinterpret_cast<const float*>(all_values.data());
    std::size_t name_at = 0;
    for (std::size_t k = 0; k < all_counts.size() / sizeof(int); ++k) {
        const std::size_t end = std::string_view(all_names.data(), all_names.size()).find('\n', name_at);
        out.emplace_back(std::string(all_names.data() + name_at, end - name_at), std::vector<float>(value, value + count[k]));
        name_at = end + 1;
        value += count[k];
    }
    return out;
}

//! One GPU (rank 0): the whole model from the pipeline's initial weights, trained on the same
//! microbatches; its losses and masters, by name.
trained one_gpu(const gpt::model_config& cfg, const std::vector<std::pair<std::string, std::vector<float>>>& initial, cudaStream_t s) {
    // Rank 0 alone: a failure is a CHECK and an empty result, never a REQUIRE, which would leave
    // the other ranks waiting in the next collective.
    gpt::gpt_model<float> model(cfg, s);
    gpt::parameter_store<float>& p = model.parameters();
    CHECK(initial.size() == p.list().size());
    for (std::size_t i = 0; i < p.list().size(); ++i) {
        const gpt::parameter_info& info = p.list()[i];
        const auto it = std::find_if(initial.begin(), initial.end(), [&](const auto& n) { return n.first == info.name; });
        CHECK_MESSAGE(it != initial.end(), info.name);
        if (it == initial.end() || it->second.size() != info.count) return {};
        CAPSCOPE_CHECK(cudaMemcpyAsync(p.master(i), it->second.data(), info.count * sizeof(float), cudaMemcpyHostToDevice, s));
        CAPSCOPE_CHECK(cudaMemcpyAsync(p.value(i), it->second.data(), info.count * sizeof(float), cudaMemcpyHostToDevice, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    }
    trained out;
    for (int t = 0; t < steps; ++t) {
        for (int mb = 0; mb < cfg.microbatches; ++mb) {
            const support::batch b = batch_of(cfg, t, mb);
            model.set_batch(mb, b.tokens, b.labels, s);
        }
        model.zero_grad(s);
        for (int mb = 0; mb < cfg.microbatches; ++mb) {
            model.forward(s, mb);
            model.backward(s, mb);
        }
        model.optimizer_step(s);
        out.losses.push_back(model.loss(s));
    }
    std::vector<float> all(p.total());
    CAPSCOPE_CHECK(cudaMemcpyAsync(all.data(), p.masters(), all.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    for (const gpt::parameter_info& i : p.list())
        out.masters.emplace_back(i.name, std::vector<float>(all.begin() + std::ptrdiff_t(i.offset), all.begin() + std::ptrdiff_t(i.offset + i.count)));
    return out;
}

//! The losses of the last stage's rank, on every rank.
std::vector<float> losses_everywhere(const trained& t, int last_rank) {
    std::vector<float> l = t.losses;
    l.resize(std::size_t(steps));
    CAPSCOPE_MPI_CHECK(MPI_Bcast(l.data(), steps, MPI_FLOAT, last_rank, MPI_COMM_WORLD));
    return l;
}

void check_schedule(const pl::schedule_shape& shape, const std::string& pattern, int microbatches) {
    cuda::stream s;
    const gpt::model_config cfg = pipelined_model(pattern, microbatches);
    const int rank = comm().rank(), last_rank = shape.rank_of(shape.stages() - 1);
    std::vector<std::pair<std::string, std::vector<float>>> initial;
    const trained eager = train(cfg, shape, impl::eager, s, &initial);
    std::string verdicts;
    bool every_impl = true;
    for (impl how : {impl::local, impl::transformer_engine, impl::full_iteration}) {
        const trained got = train(cfg, shape, how, s);
        const bool same = all_ranks(got.losses == eager.losses && got.masters == eager.masters);
        verdicts += std::string(", eager ") + (same ? "=" : "!=") + " " + impl_names[int(how)];
        every_impl = every_impl && same;
    }
    // One GPU: the whole model, from the same initial weights, on the same microbatches.
    const auto initial_all = gather_named(initial), final_all = gather_named(eager.masters);
    const std::vector<float> pipelined_losses = losses_everywhere(eager, last_rank);
    double loss_diff = 0, weight_diff = 0;
    bool bitwise = true;
    if (rank == 0) {
        const trained single = one_gpu(cfg, initial_all, s);
        bitwise = single.losses.size() == std::size_t(steps);
        loss_diff = weight_diff = bitwise ? 0.0 : 1.0; // no one-GPU run: fails below
        for (int t = 0; bitwise && t < steps; ++t) {
            loss_diff = std::max(loss_diff, double(std::fabs(single.losses[std::size_t(t)] - pipelined_losses[std::size_t(t)])));
            bitwise = bitwise && single.losses[std::size_t(t)] == pipelined_losses[std::size_t(t)];
        }
        for (const auto& [name, v] : single.masters) {
            const auto it = std::find_if(final_all.begin(), final_all.end(), [&](const auto& n) { return n.first == name; });
            if (it == final_all.end() || it->second.size() != v.size()) {
                weight_diff = 1.0, bitwise = false;
                continue;
            }
            for (std::size_t i = 0; i < v.size(); ++i) weight_diff = std::max(weight_diff, double(std::fabs(v[i] - it->second[i])));
            bitwise = bitwise && v == it->second;
        }
    }
    if (rank == 0) {
        const pl::slot_plan plan = pl::plan_slots(shape, 0, microbatches);
        std::string slots;
        for (int k : plan.slots) slots += (slots.empty() ? "" : "+") + std::to_string(k);
        const bool per_edge = pl::choose_communicators(shape, microbatches).layout == pl::communicator_layout::per_edge;
        std::printf("example model pipelined, %s%s, %d ranks%s, pattern %s, %d microbatches (%s activation slots on rank 0), %d steps: losses %.5f -> %.5f%s; "
                    "one GPU: %s (largest difference: loss %.3g, weight %.3g)\n",
                    std::string(pl::name_of(shape.kind)).c_str(),
                    per_edge ? (" (" + std::string(pl::name_of(shape.grouping)) + ", a communicator per edge)").c_str() : "", shape.ranks,
                    shape.virtual_stages > 1 ? (" x " + std::to_string(shape.virtual_stages) + " chunks").c_str() : "", pattern.c_str(),
                    microbatches, slots.c_str(), steps, pipelined_losses.front(), pipelined_losses.back(), verdicts.c_str(),
                    bitwise ? "bitwise equal" : "within tolerance", loss_diff, weight_diff);
        std::fflush(stdout);
    }
    CHECK_MESSAGE(every_impl, "an impl differs from the eager pipeline");
    CHECK(pipelined_losses.back() < pipelined_losses.front());
    if (rank == 0) {
        // The same kernels in the same order per microbatch; the only difference allowed is none
        // beyond fp32 rounding of a different launch configuration.
        CHECK(loss_diff <= 1e-5);
        CHECK(weight_diff <= 1e-5);
    }
}

std::string pattern_for(int layers) {
    std::string p;
    for (int i = 0; i < layers; ++i) p += "DEMD"[i % 4];
    return p;
}

//! The microbatch count changing every step (`cycle` in turn), two ways that must agree bit for
//! bit: eager (each count's program issued from the host) and phase graphs captured once, with
//! no capture after the first graph step. Both models address the phase layout's slots.
void check_phased(const pl::schedule_shape& shape, const std::vector<int>& cycle, int step_count) {
    cuda::stream s;
    const int rank = comm().rank(), last_rank = shape.rank_of(shape.stages() - 1);
    const gpt::model_config cfg = pipelined_model(pattern_for(shape.layers), *std::max_element(cycle.begin(), cycle.end()));
    gpt::pipeline_model<float> eager(cfg, shape, rank, s, gpt::pipeline_slots::phased), graphed(cfg, shape, rank, s, gpt::pipeline_slots::phased);
    std::map<int, pipeline_p2p> programs;
    for (int m : cycle) programs.emplace(m, pipeline_p2p(comm(), shape, m));
    pipeline_phase_graphs phases(comm(), shape);
    std::vector<float> eager_losses, graph_losses;
    int captured = 0;
    bool first_step_as_planned = false;
    for (int t = 0; t < step_count; ++t) {
        const int m = cycle[std::size_t(t) % cycle.size()];
        for (int mb = 0; mb < m; ++mb) {
            const support::batch b = batch_of(cfg, t, mb);
            eager.set_batch(mb, b.tokens, b.labels, s);
            graphed.set_batch(mb, b.tokens, b.labels, s);
        }
        eager.step(programs.at(m), s);
        if (t == 0) {
            // The step's 1/M comes from device memory, set by begin_step: a phased model made for
            // up to 16 and stepped with 8 must equal a planned model made for 8.
            gpt::pipeline_model<float> planned(pipelined_model(pattern_for(shape.layers), m), shape, rank, s);
            for (int mb = 0; mb < m; ++mb) {
                const support::batch b = batch_of(cfg, t, mb);
                planned.set_batch(mb, b.tokens, b.labels, s);
            }
            planned.step(programs.at(m), s);
            first_step_as_planned = masters_of(planned, s) == masters_of(eager, s);
        }
        if (t == 0) graphed.step(programs.at(m), s); // NCCL opens its connections on the first send: eagerly
        else {
            graphed.step(phases, m, s);
            if (t == 1) captured = phases.graphs_captured();
        }
        if (eager.has_last_stage()) eager_losses.push_back(eager.loss(s)), graph_losses.push_back(graphed.loss(s));
    }
    const bool no_recapture = phases.graphs_captured() == captured;
    const bool same = all_ranks(eager_losses == graph_losses && masters_of(eager, s) == masters_of(graphed, s) && no_recapture);
    const bool as_planned = all_ranks(first_step_as_planned);
    trained losses;
    losses.losses = eager_losses;
    const std::vector<float> first_losses = losses_everywhere(losses, last_rank);
    if (rank == 0) {
        std::string counts;
        for (int m : cycle) counts += (counts.empty() ? "" : " -> ") + std::to_string(m);
        std::printf("example model pipelined, %s phases, %d ranks%s, microbatches %s every step, %d steps: %d graphs captured once, %s; "
                    "eager %s phases, bitwise on every rank: %s (loss %.5f at the first step); the first step (%d of at most %d) %s a model planned for %d\n",
                    std::string(pl::name_of(shape.kind)).c_str(), shape.ranks,
                    shape.virtual_stages > 1 ? (" x " + std::to_string(shape.virtual_stages) + " chunks").c_str() : "", counts.c_str(), step_count,
                    captured, no_recapture ? "no capture after the first graph step" : "CAPTURED AGAIN", same ? "=" : "!=", same ? "yes" : "no",
                    first_losses.front(), cycle.front(), cfg.microbatches, as_planned ? "bitwise equal to" : "DIFFERS FROM", cycle.front());
        std::fflush(stdout);
    }
    CHECK(same);
    CHECK(as_planned);
}

} // namespace

TEST_CASE("the example model pipelined with the microbatch count changing every step, from phase graphs captured once") {
    const int ranks = comm().size();
    if (ranks < 2) {
        MESSAGE("one rank: the pipeline needs mpirun -np 2 or more");
        return;
    }
    check_phased({.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = 2 * ranks}, {8, 12, 16}, 9);
    const pl::schedule_shape looped{.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = 2 * ranks};
    const int least = pl::phase_layout_of(looped, comm().rank()).least_microbatches, g = looped.group_size();
    const int first = std::max(8, (least + g - 1) / g * g), step = std::lcm(g, 4);
    check_phased(looped, {first, first + step, first + 2 * step}, 9);
}

TEST_CASE("the example model pipelined: every impl bitwise equal to its eager pipeline, which equals one GPU") {
    const int ranks = comm().size();
    if (ranks < 2) {
        MESSAGE("one rank: the pipeline needs mpirun -np 2 or more");
        return;
    }
    const int microbatches = 2 * ranks;
    check_schedule({.kind = pl::schedule_kind::gpipe, .ranks = ranks, .layers = 2 * ranks}, pattern_for(2 * ranks), microbatches);
    check_schedule({.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = 2 * ranks}, pattern_for(2 * ranks), microbatches);
    check_schedule({.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = 2 * ranks},
                   pattern_for(2 * ranks), microbatches);
    // Sends and receives one by one, or interleaved and paired: a communicator and a stream per edge.
    check_schedule({.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = 2 * ranks, .grouping = pl::p2p_grouping::one_by_one},
                   pattern_for(2 * ranks), microbatches);
    check_schedule({.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = 2 * ranks,
                    .grouping = pl::p2p_grouping::paired},
                   pattern_for(2 * ranks), microbatches);

    // An issuer of another grouping runs the same passes, but its receives land in other slots:
    // refused on every rank before anything is sent.
    cuda::stream s;
    const pl::schedule_shape megatron{.kind = pl::schedule_kind::interleaved_1f1b, .ranks = ranks, .virtual_stages = 2, .layers = 2 * ranks};
    pl::schedule_shape paired = megatron;
    paired.grouping = pl::p2p_grouping::paired;
    gpt::pipeline_model<float> model(pipelined_model(pattern_for(2 * ranks), microbatches), megatron, comm().rank(), s);
    const pipeline_p2p other(comm(), paired, microbatches);
    std::string refusal;
    try {
        model.step(other, s);
    } catch (const std::invalid_argument& e) {
        refusal = e.what();
    }
    CHECK(refusal.find("another program") != std::string::npos);

    // Buffers that let two operations of one NCCL group share bytes: the issuer's proof of its
    // order (pipeline/issued_order.hpp) refuses them on every rank before anything is sent.
    const pl::schedule_shape plain{.kind = pl::schedule_kind::one_f_one_b, .ranks = ranks, .layers = ranks};
    const pipeline_p2p issuer(comm(), plain, 2 * ranks);
    cuda::device_buffer<float> one(64);
    std::string unordered;
    try {
        issuer.run([&](const pl::p2p_op&) { return p2p_buffer{one.data(), one.bytes()}; }, [](const pl::compute_action&, cudaStream_t) {}, s);
    } catch (const std::logic_error& e) {
        unordered = e.what();
    }
    CHECK(unordered.find("at once, in one NCCL group") != std::string::npos);
    CHECK(all_ranks(!unordered.empty()));
}

TEST_CASE("the example model pipelined refuses what it cannot run") {
    cuda::stream s;
    const pl::schedule_shape shape{.kind = pl::schedule_kind::one_f_one_b, .ranks = 2, .layers = 4};
    gpt::model_config c = pipelined_model("DEMD", 4);
    auto refusal = [&](const gpt::model_config& cfg, const pl::schedule_shape& sh) -> std::string {
        try {
            gpt::pipeline_model<float> m(cfg, sh, 0, s);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "";
    };
    CHECK(refusal(c, shape).empty());
    CHECK(refusal(c, {.kind = pl::schedule_kind::one_f_one_b, .ranks = 2, .layers = 6}).find("schedule_shape::layers") != std::string::npos);
    CHECK(refusal(c, {.kind = pl::schedule_kind::one_f_one_b, .ranks = 3, .layers = 4}).find("PP2") != std::string::npos);
    gpt::model_config dropout = c;
    dropout.hidden_dropout = 0.1f;
    CHECK(refusal(dropout, shape).find("hidden_dropout") != std::string::npos);
    gpt::model_config dropless = c;
    dropless.moe_mode = gpt::moe_mode::dropless;
    CHECK(refusal(dropless, shape).find("drop_and_pad") != std::string::npos);
    std::string fp16;
    try {
        gpt::pipeline_model<__half> m(c, shape, 0, s);
    } catch (const std::invalid_argument& e) {
        fp16 = e.what();
    }
    CHECK(fp16.find("loss scaling") != std::string::npos);

    // More forwards than microbatches since begin_step: nothing read or written past the
    // microbatches, and the loss refuses to answer.
    const pl::schedule_shape alone{.kind = pl::schedule_kind::one_f_one_b, .ranks = 2, .layers = 4};
    gpt::pipeline_model<float> first(c, alone, 0, s);
    for (int twice = 0; twice < 2; ++twice)
        for (int mb = 0; mb < c.microbatches; ++mb) first.pass({pl::pass::forward, 0, mb}, s);
    gpt::pipeline_model<float> last(c, alone, 1, s);
    for (int twice = 0; twice < 2; ++twice)
        for (int mb = 0; mb < c.microbatches; ++mb) last.pass({pl::pass::forward, 0, mb}, s);
    std::string overrun;
    try {
        (void)last.loss(s);
    } catch (const std::logic_error& e) {
        overrun = e.what();
    }
    CHECK(overrun.find("begin_step") != std::string::npos);
    last.begin_step(s);
    for (int mb = 0; mb < c.microbatches; ++mb) last.pass({pl::pass::forward, 0, mb}, s);
    CHECK_NOTHROW((void)last.loss(s)); // the flag is cleared by begin_step
}
