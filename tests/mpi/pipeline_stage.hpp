#pragma once
// The pipeline probe's model, shared by tests/mpi/pipeline_p2p_probe.cpp and bench/pipeline.cpp:
// each stage y = x * w + 1/4 in fp32, the data, the CPU's reference, and one rank's state (weights,
// activation and gradient slots, send buffers) with its passes and its sends' and receives'
// buffers, and its step issued eagerly or with each pass replayed from a graph.

#include "../../examples/common/pipeline_kernels.hpp"

#include <capscope/cuda/buffer.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/parallel/pipeline_pass_graphs.hpp>
#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/phases.hpp>

#include <algorithm>
#include <optional>
#include <vector>

namespace pipeline_model {

using namespace capscope;
using pipeline::compute_action;
using pipeline::pass;

inline constexpr float lr = 0.01f;

inline float data_at(int mb, int i) { return float((i * 7 + mb * 31) % 29) / 29.f - 0.5f; }
inline float weight_at(int stage, int i) { return 1.f + float((i * 13 + stage * 7) % 17) / 170.f; }

//! The CPU's answer: stage `stage`'s weights after a step per count, each of every microbatch
//! through every stage, backwards in microbatch order (as every rank runs them).
inline std::vector<float> reference(int stages, int stage, const std::vector<int>& counts, int n) {
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
    //! The last stage's forward output, which it sends nowhere: kept out of `out`, whose send (of
    //! another chunk, on a communicator per edge) may still be reading it.
    cuda::device_buffer<float> last_out;
    std::vector<int> slot_of, gradient_slot_of;                   //!< per (chunk, microbatch)
    //! Phased (pipeline_phases.hpp): microbatch k's slots in chunk c are the layout's k mod S_c and
    //! its gradient's offset_c + k mod G_c for every count, and the first stage loads its data into
    //! its slot through a device counter.
    std::optional<pipeline::phase_layout> phased;
    //! Phased, or passes replayed as graphs (pipeline_pass_graphs): the first stage loads its
    //! microbatch into its slot through a device counter, since a graph's host values are fixed.
    bool pooled = false;
    cuda::device_buffer<float> pool;  //!< pooled: every microbatch's data, in order
    cuda::device_buffer<int> counter; //!< pooled: the next microbatch the first stage loads
    stage_state(int n_, int rank_, int ranks_, int chunks_, const pipeline::slot_plan& plan, int microbatches_, cudaStream_t s,
                std::optional<pipeline::phase_layout> phased_ = std::nullopt, bool pooled_ = false)
        : n(n_), rank(rank_), ranks(ranks_), chunks(chunks_), microbatches(microbatches_), out(std::size_t(n_)), grad_out(std::size_t(n_)), last_out(std::size_t(n_)),
          slot_of(std::size_t(chunks_ * microbatches_), -1), gradient_slot_of(std::size_t(chunks_ * microbatches_), -1), phased(phased_),
          pooled(phased_.has_value() || pooled_), pool(pooled && rank_ == 0 ? std::size_t(n_) * std::size_t(microbatches_) : 1), counter(1) {
        std::vector<float> host(static_cast<std::size_t>(n));
        for (int c = 0; c < chunks; ++c) {
            for (int i = 0; i < n; ++i) host[std::size_t(i)] = weight_at(c * ranks + rank, i);
            w.emplace_back(std::size_t(n)).copy_from_host(host, s);
            dw.emplace_back(std::size_t(n)).fill_bytes(0, s);
            slots.emplace_back();
            const int chunk_slots = phased ? phased->chunk_slots[std::size_t(c)] : plan.slots[std::size_t(c)];
            for (int k = 0; k < chunk_slots; ++k) slots.back().emplace_back(std::size_t(n));
        }
        for (int k = 0; k < (phased ? phased->gradient_slots : plan.gradient_slots); ++k) gradients.emplace_back(std::size_t(n));
        for (const pipeline::slot_use& u : plan.uses) slot_of[std::size_t(u.chunk * microbatches + u.microbatch)] = u.slot;
        for (const pipeline::gradient_use& u : plan.gradients) gradient_slot_of[std::size_t(u.chunk * microbatches + u.microbatch)] = u.slot;
        if (pooled && rank == 0) {
            std::vector<float> all(std::size_t(n) * std::size_t(microbatches));
            for (int mb = 0; mb < microbatches; ++mb)
                for (int i = 0; i < n; ++i) all[std::size_t(mb) * std::size_t(n) + std::size_t(i)] = data_at(mb, i);
            pool.copy_from_host(all, s);
            CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        }
        if (rank == 0 && !pooled)
            for (int mb = 0; mb < microbatches; ++mb) {
                for (int i = 0; i < n; ++i) host[std::size_t(i)] = data_at(mb, i);
                data.emplace_back(std::size_t(n)).copy_from_host(host, s);
            }
        CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors go
    }
    //! Passes replayed as graphs (pipeline_pass_graphs): its buffers addressed by the slots the
    //! graphs are keyed by, read from `passes`, not planned again here.
    stage_state(int n_, int rank_, int ranks_, const pipeline_pass_graphs& passes, cudaStream_t s)
        : stage_state(n_, rank_, ranks_, passes.chunks(), plan_of(passes), passes.microbatches(), s, std::nullopt, true) {}
    //! What this state reads of a slot plan (each microbatch's slots, the slots per chunk), as
    //! `passes` gives them.
    static pipeline::slot_plan plan_of(const pipeline_pass_graphs& passes) {
        pipeline::slot_plan plan;
        plan.slots.assign(std::size_t(passes.chunks()), 0);
        for (int c = 0; c < passes.chunks(); ++c)
            for (int mb = 0; mb < passes.microbatches(); ++mb) {
                if (const int k = passes.activation_slot(c, mb); k >= 0) {
                    plan.uses.push_back({c, mb, k});
                    plan.slots[std::size_t(c)] = std::max(plan.slots[std::size_t(c)], k + 1);
                }
                if (const int k = passes.gradient_slot(c, mb); k >= 0) {
                    plan.gradients.push_back({c, mb, k});
                    plan.gradient_slots = std::max(plan.gradient_slots, k + 1);
                }
            }
        return plan;
    }
    int stage_of(int chunk) const { return chunk * ranks + rank; }
    float* input(int chunk, int mb) {
        if (phased) return slots[std::size_t(chunk)][std::size_t(phased->activation_slot(chunk, mb))].data();
        if (stage_of(chunk) == 0 && !pooled) return data[std::size_t(mb)].data();
        return slots[std::size_t(chunk)][std::size_t(slot_of[std::size_t(chunk * microbatches + mb)])].data();
    }
    float* gradient(int chunk, int mb) {
        if (phased) return gradients[std::size_t(phased->gradient_slot(chunk, mb))].data();
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
        if (pooled && a.direction == pass::forward && stage_of(a.chunk) == 0) pipeline_kernels::load_next(pool.data(), counter.data(), x, n, s);
        if (a.direction == pass::forward)
            pipeline_kernels::forward(x, w[c].data(), stage_of(a.chunk) == ranks * chunks - 1 ? last_out.data() : out.data(), n, s);
        else if (stage_of(a.chunk) == ranks * chunks - 1) pipeline_kernels::last_backward(x, w[c].data(), dw[c].data(), dx, n, s);
        else pipeline_kernels::backward(gradient(a.chunk, a.microbatch), x, w[c].data(), dw[c].data(), dx, n, s);
    }
    void step(const pipeline_p2p& p2p, cudaStream_t s) {
        if (pooled) counter.fill_bytes(0, s);
        p2p.run([&](const pipeline::p2p_op& op) { return buffer_of(op); }, [&](const compute_action& a, cudaStream_t on) { run(a, on); }, s);
        optimizer(s);
    }
    //! The same step with each pass replayed from its graph (pipeline_pass_graphs).
    void step(pipeline_pass_graphs& passes, cudaStream_t s) {
        counter.fill_bytes(0, s);
        passes.step([&](const pipeline::p2p_op& op) { return buffer_of(op); }, [&](const compute_action& a, cudaStream_t on) { run(a, on); }, s);
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

} // namespace pipeline_model
