#pragma once
//! @file
//! The example model split over pipeline ranks: one rank's chunks of it, for a schedule of
//! capscope's pipeline layer (capscope/pipeline.hpp). Chunk c of rank r is virtual stage
//! s = c * ranks + r and holds the layers [s * L, (s + 1) * L) of the model's pattern
//! (L = layers / stages); stage 0 also holds the embedding, the last stage the final norm, the LM
//! head and the loss. Each chunk has its own parameters, AdamW state and blocks.
//!
//! Memory is sized by in-flight slots, not by microbatches (pipeline::plan_slots): a chunk keeps
//! only each live microbatch's input (a received activation, or stage 0's tokens) in its slot, and
//! a backward first recomputes its forward from that input (full recomputation), so one set of
//! activation buffers per chunk serves every microbatch. Received gradients wait in the rank's
//! gradient slots. Sends read buffers of their own, written only by the pass that computes them.
//!
//! A pass is addressed by its slots only; the microbatch it runs (the tokens stage 0 loads, the
//! labels the last stage reads, where its loss goes) is read from a counter in device memory,
//! since each chunk runs its forwards in microbatch order. So one graph per pass and slot serves
//! every microbatch (capscope::pipeline_pass_graphs), and a whole step captured as one graph
//! replays correctly.
//!
//! `step(issuer, stream)` runs a step: the gradients cleared, the passes with their sends and
//! receives (a `capscope::pipeline_p2p` issued eagerly or inside a capture, or a
//! `capscope::pipeline_pass_graphs`), then AdamW on every chunk.
//!
//! Not supported, refused at construction: dropout (a recomputed forward would draw other masks),
//! dropless MoE (its counts are read on the host), the finite check and loss scaling (the ranks
//! would decide apart), and so fp16, which needs loss scaling. Activation offloading is not offered.

#include <gpt/backward_scratch.hpp>
#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/model.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/offload/activation_store.hpp>
#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/p2p_buffer.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/schedule_shape.hpp>

#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

namespace gpt {

template <class T>
class pipeline_model {
public:
    //! Rank `rank`'s chunks of the model `cfg` (cfg.microbatches: the step's microbatch count) for
    //! `shape` (shape.layers must be the pattern's length). Each chunk's parameters are drawn from
    //! cfg.seed in the chunk's own order (tests that compare with one GPU copy them across).
    //! Throws std::invalid_argument on a shape the rules refuse or a config it cannot run.
    pipeline_model(const model_config& cfg, const capscope::pipeline::schedule_shape& shape, int rank, cudaStream_t setup_stream);
    pipeline_model(const pipeline_model&) = delete;
    pipeline_model& operator=(const pipeline_model&) = delete;
    ~pipeline_model();

    //! Keeps what this rank reads of microbatch `microbatch` (stage 0: the tokens; the last stage:
    //! the labels), checked as gpt_model::set_batch checks them. Every rank may call it alike.
    void set_batch(int microbatch, std::span<const int> tokens, std::span<const int> labels, cudaStream_t s);

    //! The buffer a send of this rank reads or a receive writes (for the issuer).
    capscope::p2p_buffer buffer_of(const capscope::pipeline::p2p_op& op) const;
    //! One pass: a forward, or a backward (its forward recomputed first) of a chunk's microbatch.
    void pass(const capscope::pipeline::compute_action& a, cudaStream_t s);
    //! Gradients cleared and the microbatch counters (and their overrun flag) reset: a step's start.
    void begin_step(cudaStream_t s);
    void set_optimizer(const adamw_config& opt, cudaStream_t s);
    //! AdamW over every chunk's parameters (one step count for the rank).
    void optimizer_step(cudaStream_t s);

    //! A whole step on `stream`: begin_step, the passes with their sends and receives through
    //! `issuer` (a pipeline_p2p: `run`; a pipeline_pass_graphs: `step`), made for this shape,
    //! rank and microbatch count, then optimizer_step.
    template <class Issuer>
    void step(Issuer& issuer, cudaStream_t stream) {
        if (!same_program(issuer.program()))
            throw std::invalid_argument("gpt::pipeline_model::step: the issuer runs another program than this rank's (its passes, or "
                                        "its sends and receives, which place the slots) -- fix: make it for the same schedule_shape "
                                        "(grouping included), rank and microbatch count (model_config::microbatches)");
        begin_step(stream);
        auto buffers = [this](const capscope::pipeline::p2p_op& op) { return buffer_of(op); };
        auto passes = [this](const capscope::pipeline::compute_action& a, cudaStream_t on) { pass(a, on); };
        if constexpr (requires { issuer.step(buffers, passes, stream); }) issuer.step(buffers, passes, stream);
        else issuer.run(buffers, passes, stream);
        optimizer_step(stream);
    }

    //! Whether `p` is this rank's program: the same rank, passes and groups of sends and receives
    //! (the slots follow from where the receives are issued).
    bool same_program(const capscope::pipeline::rank_program& p) const {
        if (p.rank != program_.rank || p.compute != program_.compute || p.groups.size() != program_.groups.size()) return false;
        for (std::size_t g = 0; g < p.groups.size(); ++g) {
            const capscope::pipeline::p2p_group &a = p.groups[g], &b = program_.groups[g];
            if (a.after != b.after || a.ops.size() != b.ops.size()) return false;
            for (std::size_t k = 0; k < a.ops.size(); ++k)
                if (!(a.ops[k] == b.ops[k])) return false;
        }
        return true;
    }

    //! The mean of the last step's microbatch losses (the last stage's rank only; synchronizes `s`).
    //! Throws std::logic_error when a chunk ran more forwards than microbatches since begin_step.
    float loss(cudaStream_t s) const;
    bool has_first_stage() const { return first_stage_ == 0; }
    bool has_last_stage() const { return last_stage_ == shape_.stages() - 1; }

    int chunks() const { return int(chunks_.size()); }
    //! Chunk `chunk`'s layers, [first, end) of the pattern.
    int first_layer(int chunk) const;
    int end_layer(int chunk) const;
    parameter_store<T>& parameters(int chunk);
    const parameter_store<T>& parameters(int chunk) const;
    const capscope::pipeline::slot_plan& slots() const { return slots_; }
    //! Device bytes of the slots (inputs and received gradients kept between passes).
    std::size_t slot_bytes() const;
    const model_config& config() const { return cfg_; }
    const capscope::pipeline::schedule_shape& shape() const { return shape_; }

private:
    struct chunk_state;
    chunk_state& at(int chunk) const;
    void forward_of(chunk_state& c, int slot, cudaStream_t s, bool recompute);
    //! The chunk's backward after its forward: from `received` (the gradient of its output; the
    //! head computes its own), into its gradients and its send (or the embedding's gradients).
    void backward_of(chunk_state& c, int slot, const T* received, cudaStream_t s);
    void load_kernels(cudaStream_t s); //!< every pass's kernel launched once, before any send or receive
    void check_counters(cudaStream_t s) const; //!< throws when a chunk ran past its microbatches (synchronizes `s`)

    model_config cfg_;
    capscope::pipeline::schedule_shape shape_;
    int rank_;
    int first_stage_ = 0, last_stage_ = 0; //!< the virtual stages of the first and last chunk
    capscope::pipeline::rank_program program_;
    capscope::pipeline::slot_plan slots_;
    std::vector<int> slot_of_, gradient_slot_of_; //!< per (chunk, microbatch)
    capscope::cuda::blas_handle blas_;
    std::vector<std::unique_ptr<chunk_state>> chunks_;
    std::vector<capscope::cuda::device_buffer<T>> gradient_slots_;
    capscope::cuda::device_buffer<int> device_step_;
    capscope::cuda::device_buffer<int> overrun_; //!< 1 once a chunk ran more forwards than microbatches since begin_step
    capscope::cuda::device_buffer<float> hyperparameters_;
    capscope::cuda::pinned_buffer<float> host_loss_;
};

} // namespace gpt
