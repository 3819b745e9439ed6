// A pipeline step with its sends and receives captured inside one graph, on every rank of an MPI
// job (one process per GPU): 1F1B, GPipe and interleaved 1F1B (two chunks per rank, groups of the
// ranks and of one more), each stage y = x * w + 1/4, trained a few steps three ways that must
// agree bit for bit:
// - eager: the rank's program (capscope/parallel/pipeline_p2p.hpp) issued step by step;
// - graph: one eager step (NCCL opens its connections on the first send), then the whole step,
//   sends, receives and the optimizer included, captured once and replayed;
// - the CPU: the same microbatches through every stage in turn, the same float operations.
// Activations wait in slots (pipeline::plan_slots), received gradients too: memory by in-flight
// microbatches. Sends and receives are grouped as Megatron groups them, on one communicator.
// Then 1F1B with the count cycling 8 -> 12 -> 16 every step for 100 steps, from graphs captured
// once (pipeline_phase_graphs), each launch after a random delay on each rank.
//
//   pipeline_p2p_probe gpus                    prints the usable GPU count
//   pipeline_p2p_probe [--floats N] [--steps T] [--microbatches M] [--kind 1f1b|gpipe|interleaved 1f1b|1f1b phases] [--grouping megatron|paired|one_by_one]
//                      [--phase-steps T] [--delay-us D]
//       exit 0 when every case agrees, 1 when one differs, 77 with one rank; under
//       CAPSCOPE_BREAK=skip_replay_check with --grouping one_by_one, sends and receives the replay
//       check refuses are issued anyway (does the hang it predicts happen?)

#include "../gpu/breakage.hpp"
#include "../gpu/mpi_support.hpp"
#include "pipeline_kernels.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_phases.hpp>
#include <capscope/pipeline/activation_slots.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

using namespace capscope;
using pipeline::compute_action;
using pipeline::pass;

namespace {

constexpr float lr = 0.01f;

float data_at(int mb, int i) { return float((i * 7 + mb * 31) % 29) / 29.f - 0.5f; }
float weight_at(int stage, int i) { return 1.f + float((i * 13 + stage * 7) % 17) / 170.f; }

//! The CPU's answer: stage `stage`'s weights after a step per count, each of every microbatch
//! through every stage, backwards in microbatch order (as every rank runs them).
std::vector<float> reference(int stages, int stage, const std::vector<int>& counts, int n) {
    const std::size_t S = std::size_t(stages), N = std::size_t(n);
    std::vector<std::vector<float>> w(S, std::vector<float>(N, 0.f)), dw = w, x = w;
    for (std::size_t s = 0; s < S; ++s)
        for (std::size_t i = 0; i < N; ++i) w[s][i] = weight_at(int(s), int(i));
    for (const int microbatches : counts) {
        for (int mb = 0; mb < microbatches; ++mb)
            for (std::size_t i = 0; i < N; ++i) {
                float v = data_at(mb, int(i));
                for (std::size_t s = 0; s < S; ++s) {
                    x[s][i] = v;
                    const float product = v * w[s][i];
                    v = product + 0.25f;
                }
                float g = v; // the last stage's output is its own gradient
                for (std::size_t s = S; s-- > 0;) {
                    const float product = g * x[s][i];
                    dw[s][i] = dw[s][i] + product;
                    g = g * w[s][i];
                }
            }
        for (std::size_t s = 0; s < S; ++s)
            for (std::size_t i = 0; i < N; ++i) {
                const float step = lr * dw[s][i];
                w[s][i] = w[s][i] - step;
                dw[s][i] = 0.f;
            }
    }
    return w[std::size_t(stage)];
}

//! One rank's stages (one per chunk): weights and gradients, activation slots per chunk, slots
//! for received gradients, and the buffers its sends read. (The first stage reads its data where
//! it is: the slots plan_slots gives its chunk 0 stay unused.)
struct stage_state {
    int n, rank, ranks, chunks, microbatches;
    std::vector<cuda::device_buffer<float>> w, dw;               //!< per chunk
    std::vector<std::vector<cuda::device_buffer<float>>> slots;   //!< per chunk, per slot
    std::vector<cuda::device_buffer<float>> gradients, data;      //!< received gradients' slots; the first stage's inputs
    cuda::device_buffer<float> out, grad_out;                     //!< what the next send reads
    std::vector<int> slot_of, gradient_slot_of;                   //!< per (chunk, microbatch)
    //! Phased (pipeline_phases.hpp): microbatch k's slots are the layout's k mod S and k mod G for
    //! every count, and the first stage loads its data into its slot through a device counter.
    std::optional<pipeline::phase_layout> phased;
    cuda::device_buffer<float> pool;  //!< phased: every microbatch's data, in order
    cuda::device_buffer<int> counter; //!< phased: the next microbatch the first stage loads
    stage_state(int n_, int rank_, int ranks_, int chunks_, const pipeline::slot_plan& plan, int microbatches_, cudaStream_t s,
                std::optional<pipeline::phase_layout> phased_ = std::nullopt)
        : n(n_), rank(rank_), ranks(ranks_), chunks(chunks_), microbatches(microbatches_), out(std::size_t(n_)), grad_out(std::size_t(n_)),
          slot_of(std::size_t(chunks_ * microbatches_), -1), gradient_slot_of(std::size_t(chunks_ * microbatches_), -1), phased(phased_),
          pool(phased_ && rank_ == 0 ? std::size_t(n_) * std::size_t(microbatches_) : 1), counter(1) {
        std::vector<float> host(static_cast<std::size_t>(n));
        for (int c = 0; c < chunks; ++c) {
            for (int i = 0; i < n; ++i) host[std::size_t(i)] = weight_at(c * ranks + rank, i);
            w.emplace_back(std::size_t(n)).copy_from_host(host, s);
            dw.emplace_back(std::size_t(n)).fill_bytes(0, s);
            slots.emplace_back();
            for (int k = 0; k < plan.slots[std::size_t(c)]; ++k) slots.back().emplace_back(std::size_t(n));
        }
        for (int k = 0; k < plan.gradient_slots; ++k) gradients.emplace_back(std::size_t(n));
        for (const pipeline::slot_use& u : plan.uses) slot_of[std::size_t(u.chunk * microbatches + u.microbatch)] = u.slot;
        for (const pipeline::gradient_use& u : plan.gradients) gradient_slot_of[std::size_t(u.chunk * microbatches + u.microbatch)] = u.slot;
        if (phased && rank == 0) {
            std::vector<float> all(std::size_t(n) * std::size_t(microbatches));
            for (int mb = 0; mb < microbatches; ++mb)
                for (int i = 0; i < n; ++i) all[std::size_t(mb) * std::size_t(n) + std::size_t(i)] = data_at(mb, i);
            pool.copy_from_host(all, s);
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        }
        if (rank == 0 && !phased)
            for (int mb = 0; mb < microbatches; ++mb) {
                for (int i = 0; i < n; ++i) host[std::size_t(i)] = data_at(mb, i);
                data.emplace_back(std::size_t(n)).copy_from_host(host, s);
            }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors go
    }
    int stage_of(int chunk) const { return chunk * ranks + rank; }
    float* input(int chunk, int mb) {
        if (phased) return slots[std::size_t(chunk)][std::size_t(phased->activation_slot(mb))].data();
        if (stage_of(chunk) == 0) return data[std::size_t(mb)].data();
        return slots[std::size_t(chunk)][std::size_t(slot_of[std::size_t(chunk * microbatches + mb)])].data();
    }
    float* gradient(int chunk, int mb) {
        if (phased) return gradients[std::size_t(phased->gradient_slot(mb))].data();
        return gradients[std::size_t(gradient_slot_of[std::size_t(chunk * microbatches + mb)])].data(); }

    p2p_buffer buffer_of(const pipeline::p2p_op& op) {
        const std::size_t bytes = std::size_t(n) * sizeof(float);
        const int chunk = op.m.stage / ranks;
        if (op.m.what == pipeline::carries::activation) return {op.send ? out.data() : input(chunk, op.m.microbatch), bytes};
        return {op.send ? grad_out.data() : gradient(chunk, op.m.microbatch), bytes};
    }
    void run(const compute_action& a, cudaStream_t s) {
        const std::size_t c = std::size_t(a.chunk);
        float* x = input(a.chunk, a.microbatch);
        float* dx = stage_of(a.chunk) > 0 ? grad_out.data() : nullptr;
        if (phased && a.direction == pass::forward && stage_of(a.chunk) == 0) pipeline_kernels::load_next(pool.data(), counter.data(), x, n, s);
        if (a.direction == pass::forward) pipeline_kernels::forward(x, w[c].data(), out.data(), n, s);
        else if (stage_of(a.chunk) == ranks * chunks - 1) pipeline_kernels::last_backward(x, w[c].data(), dw[c].data(), dx, n, s);
        else pipeline_kernels::backward(gradient(a.chunk, a.microbatch), x, w[c].data(), dw[c].data(), dx, n, s);
    }
    void step(const pipeline_p2p& p2p, cudaStream_t s) {
        if (phased) counter.fill_bytes(0, s);
        p2p.run([&](const pipeline::p2p_op& op) { return buffer_of(op); }, [&](const compute_action& a, cudaStream_t on) { run(a, on); }, s);
        optimizer(s);
    }
    void optimizer(cudaStream_t s) {
        for (int c = 0; c < chunks; ++c) pipeline_kernels::sgd(w[std::size_t(c)].data(), dw[std::size_t(c)].data(), lr, n, s);
    }
    std::vector<float> weights(int chunk, cudaStream_t s) const {
        std::vector<float> host(static_cast<std::size_t>(n));
        w[std::size_t(chunk)].copy_to_host(host, s);
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        return host;
    }
};

bool all_ranks(bool mine) {
    int ok = mine ? 1 : 0, all = 0;
    CAPSCOPE_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all == 1;
}

bool run_case(const pipeline::schedule_shape& shape, int microbatches, int steps, int n) {
    const int ranks = support::comm().size(), rank = support::comm().rank();
    cuda::stream s;
    const pipeline_p2p p2p(support::comm(), shape, microbatches);
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, microbatches);
    stage_state eager(n, rank, ranks, shape.virtual_stages, plan, microbatches, s), graphed(n, rank, ranks, shape.virtual_stages, plan, microbatches, s);
    for (int t = 0; t < steps; ++t) eager.step(p2p, s);
    graphed.step(p2p, s); // NCCL opens its connections on the first send: eagerly, before the capture
    const cuda::graph g = cuda::capture(s, [&](cudaStream_t on) { graphed.step(p2p, on); });
    const cuda::graph_exec exec(g);
    for (int t = 1; t < steps; ++t) exec.launch(s);
    bool eager_graph = true, graph_cpu = true;
    for (int c = 0; c < shape.virtual_stages; ++c) {
        const std::vector<float> a = eager.weights(c, s), b = graphed.weights(c, s);
        eager_graph = eager_graph && a == b;
        graph_cpu = graph_cpu && b == reference(ranks * shape.virtual_stages, c * ranks + rank, std::vector<int>(std::size_t(steps), microbatches), n);
    }
    const bool same = eager_graph && graph_cpu, everywhere = all_ranks(same);
    std::string slots;
    for (int k : plan.slots) slots += (slots.empty() ? "" : "+") + std::to_string(k);
    const bool looped = shape.kind == pipeline::schedule_kind::interleaved_1f1b;
    const std::string chunks = looped ? " x " + std::to_string(shape.virtual_stages) + " chunks" : "";
    const std::string groups = looped ? " in groups of " + std::to_string(shape.group_size()) : "";
    if (rank == 0 || !same)
        std::printf("rank %d, %s, %d ranks%s, %d microbatches%s (%s activation and %d gradient slots on rank %d), %d steps: eager %s graph %s CPU%s\n",
                    rank, std::string(pipeline::name_of(shape.kind)).c_str(), ranks, chunks.c_str(), microbatches, groups.c_str(), slots.c_str(),
                    plan.gradient_slots, rank, steps, eager_graph ? "=" : "!=", graph_cpu ? "=" : "!=", everywhere ? ", bitwise on every rank" : "");
    return everywhere;
}

//! 1F1B with the microbatch count changing every step (counts in turn), three ways that must
//! agree bit for bit: eager (the whole program issued for each count), the phases captured once
//! (pipeline_phase_graphs: one eager step, then graphs only, with no capture after the first
//! step), and the CPU. Before each graph launch each rank holds its stream for a random 0 to
//! `delay_us` microseconds, so the ranks reach each group at times that differ.
bool run_phased_case(const pipeline::schedule_shape& shape, const std::vector<int>& cycle, int steps, int n, int delay_us) {
    const int ranks = support::comm().size(), rank = support::comm().rank();
    cuda::stream s;
    pipeline_phase_graphs phases(support::comm(), shape);
    const pipeline::phase_layout layout = phases.layout();
    const int most = *std::max_element(cycle.begin(), cycle.end());
    std::vector<int> counts;
    for (int t = 0; t < steps; ++t) counts.push_back(cycle[std::size_t(t) % cycle.size()]);
    std::vector<pipeline_p2p> eager_programs; // one per count: the eager pipeline issues each count's whole program
    for (int m : cycle) eager_programs.emplace_back(support::comm(), shape, m);
    auto eager_program = [&](int m) -> const pipeline_p2p& {
        return eager_programs[std::size_t(std::find(cycle.begin(), cycle.end(), m) - cycle.begin())];
    };
    const pipeline::slot_plan plan = pipeline::plan_slots(shape, rank, most);
    stage_state eager(n, rank, ranks, 1, plan, most, s, layout), graphed(n, rank, ranks, 1, plan, most, s, layout);
    for (int m : counts) eager.step(eager_program(m), s);

    graphed.step(eager_program(counts[0]), s); // NCCL opens its connections on the first send: eagerly, before the capture
    phases.capture([&](const pipeline::p2p_op& op) { return graphed.buffer_of(op); },
                   [&](const compute_action& a, cudaStream_t on) { graphed.run(a, on); }, s);
    const int captured = phases.graphs_captured();
    std::mt19937 random(20261128u + unsigned(rank));
    std::uniform_int_distribution<int> delay(0, delay_us);
    long long launches = 0;
    for (int t = 1; t < steps; ++t) {
        graphed.counter.fill_bytes(0, s);
        phases.launch(counts[std::size_t(t)], s, [&](cudaStream_t on) {
            if (delay_us > 0) pipeline_kernels::spin(1000LL * delay(random), on);
            ++launches;
        });
        graphed.optimizer(s);
    }
    const bool no_recapture = phases.graphs_captured() == captured;
    const std::vector<float> a = eager.weights(0, s), b = graphed.weights(0, s);
    const bool eager_graph = a == b, graph_cpu = b == reference(ranks, rank, counts, n);
    const bool same = eager_graph && graph_cpu && no_recapture, everywhere = all_ranks(same);
    std::string cycle_text;
    for (int m : cycle) cycle_text += (cycle_text.empty() ? "" : " -> ") + std::to_string(m);
    if (rank == 0 || !same)
        std::printf("rank %d, 1f1b phases, %d ranks, microbatches %s every step, %d steps: %d graphs captured once (warmup, %d steady, %d tails; "
                    "%d activation slots), %lld graph launches after random delays of 0-%d us, %s; eager %s graph %s CPU%s\n",
                    rank, ranks, cycle_text.c_str(), steps, captured, layout.period, layout.period, layout.activation_slots, launches, delay_us,
                    no_recapture ? "no capture after the first step" : "CAPTURED AGAIN", eager_graph ? "=" : "!=", graph_cpu ? "=" : "!=",
                    everywhere ? ", bitwise on every rank" : "");
    return everywhere;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "gpus") == 0) return std::printf("%d\n", cuda::usable_device_count()), 0;
    breakage::install_from_environment();
    int n = 1 << 16, steps = 3, only_m = 0, phase_steps = 100, delay_us = 500;
    std::string only_kind;
    pipeline::p2p_grouping grouping = pipeline::p2p_grouping::megatron;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i], value = argv[i + 1];
        if (flag == "--floats") n = std::stoi(value);
        else if (flag == "--steps") steps = std::stoi(value);
        else if (flag == "--microbatches") only_m = std::stoi(value);
        else if (flag == "--kind") only_kind = value;
        else if (flag == "--phase-steps") phase_steps = std::stoi(value);
        else if (flag == "--delay-us") delay_us = std::stoi(value);
        else if (flag == "--grouping" && (value == "megatron" || value == "paired" || value == "one_by_one"))
            grouping = value == "megatron" ? pipeline::p2p_grouping::megatron : value == "paired" ? pipeline::p2p_grouping::paired : pipeline::p2p_grouping::one_by_one;
        else return std::fprintf(stderr, "pipeline_p2p_probe: unknown option %s %s\n", flag.c_str(), value.c_str()), 2;
    }
    if (cuda::usable_device_count() == 0) return std::puts("no usable CUDA device: skipped"), 77;
    support::comm(); // takes this rank's GPU before any stream or buffer is made
    const int ranks = support::comm().size();
    if (ranks < 2) return std::puts("one rank: a pipeline needs two (mpirun -np 2): skipped"), 77;
    bool ok = true;
    try {
    for (pipeline::schedule_kind kind : {pipeline::schedule_kind::one_f_one_b, pipeline::schedule_kind::gpipe, pipeline::schedule_kind::interleaved_1f1b}) {
        if (!only_kind.empty() && only_kind != pipeline::name_of(kind)) continue;
        const bool looped = kind == pipeline::schedule_kind::interleaved_1f1b;
        for (int group : looped ? std::vector<int>{0, ranks + 1} : std::vector<int>{0}) {
            pipeline::schedule_shape shape{kind, ranks, looped ? 2 : 1, ranks * (looped ? 2 : 1), group};
            shape.grouping = grouping;
            const int g = shape.group_size();
            const std::vector<int> counts = only_m ? std::vector<int>{only_m} : looped ? std::vector<int>{g, 2 * g} : std::vector<int>{ranks, 2 * ranks + 1};
            for (int m : counts) ok = run_case(shape, m, steps, n) && ok;
        }
    }
    if ((only_kind.empty() || only_kind == "1f1b phases") && grouping == pipeline::p2p_grouping::megatron && phase_steps > 0) {
        const pipeline::schedule_shape plain{pipeline::schedule_kind::one_f_one_b, ranks, 1, ranks};
        ok = run_phased_case(plain, {8, 12, 16}, phase_steps, n, delay_us) && ok;
    }
    } catch (const std::exception& e) { // a refused schedule: on every rank alike, before anything is sent
        std::printf("rank %d: %s\n", support::mpi().rank(), e.what());
        return 1;
    }
    if (support::mpi().rank() == 0) std::printf("%s\n", ok ? "every case bitwise equal: eager, graph and CPU" : "FAIL");
    return ok ? 0 : 1;
}
