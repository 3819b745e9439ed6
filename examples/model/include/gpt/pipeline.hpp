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
//! would decide apart), and so fp16, which needs loss scaling.
//!
//! Activation offload (`activation_offload`, as gpt_model takes it): a backward pass recomputes
//! its forward and then runs its backward, as a step without a pipeline runs one microbatch, so
//! the chunk's kept tensors are offloaded there as that step offloads them: the copies of the
//! policy (capscope::with_offload, placed for the whole pass as one graph) go to host after the
//! recomputed forward writes them and come back before the backward reads them, and the chunk's
//! device ring holds fewer layers' tensors. The forward pass copies nothing: nothing reads its
//! kept tensors (the backward recomputes them). The policy is planned per chunk: the last
//! `ring.slots` groups of each module input stay in every chunk, and the offload fraction applies
//! to each chunk's groups. A pass runs its stages in list order on its one stream, so some fields
//! have no effect here: `delay_until_cuda_graph` (the copies are placed for one graph, where no
//! copy out is delayed), the overlap `max_inflight` bounds (a copy is done before the next stage
//! starts), `ring.first_lane` (no copy runs on a side lane; the planner still checks the lanes
//! exist), and `delta_bytes_across_pp_ranks` (nothing reads it). A policy under which any virtual
//! stage's chunk would move nothing is refused by every rank alike, naming that stage: each rank
//! plans every stage before it allocates, so none goes on to wait for a rank that threw.
//!
//! Hooks (`set_hooks`, capscope/hooks/with_pass_hooks.hpp): a hook pipeline's layer hooks run in
//! the passes of the chunk that holds their layer, and its step hooks around AdamW, so every impl
//! runs them where the passes run. Rule H5 refuses at compile time what a pass cannot run.

#include <gpt/backward_scratch.hpp>
#include <gpt/blocks.hpp>
#include <gpt/config.hpp>
#include <gpt/model.hpp>
#include <gpt/parameters.hpp>

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/hooks/with_pass_hooks.hpp>
#include <capscope/offload/activation_store.hpp>
#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/p2p_buffer.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/phases.hpp>
#include <capscope/pipeline/schedule_shape.hpp>

#include <memory>
#include <optional>
#include <string>
#include <span>
#include <stdexcept>
#include <vector>

namespace gpt {

//! How a pipelined model addresses its microbatches' slots.
enum class pipeline_slots {
    //! `pipeline::plan_slots` for model_config::microbatches, the one count it runs (any schedule).
    planned,
    //! The phase layout's (`pipeline::phase_layout`: microbatch k in slot k mod S), which serves
    //! every count from the layout's least up to model_config::microbatches, so that the
    //! microbatch count may change between steps, eagerly or from phase graphs captured once
    //! (capscope::pipeline_phase_graphs). 1F1B and interleaved 1F1B grouped as Megatron does.
    phased,
};

template <class T>
class pipeline_model {
public:
    //! Rank `rank`'s chunks of the model `cfg` (cfg.microbatches: the step's microbatch count) for
    //! `shape` (shape.layers must be the pattern's length). Each chunk's parameters are drawn from
    //! cfg.seed in the chunk's own order (tests that compare with one GPU copy them across).
    //! Throws std::invalid_argument on a shape the rules refuse or a config it cannot run.
    //! With `pipeline_slots::phased`, cfg.microbatches is the most a step may have.
    //! With `offload`, each chunk's kept tensors are planned under its policy (see the file
    //! comment). Every virtual stage of the pipeline, this rank's or not, is planned first (a dry
    //! run on the tensors its layers declare); when any stage's chunk would move nothing, every
    //! rank throws the same std::invalid_argument ("activation offload refuses virtual stage S
    //! (layers A-B, on rank R): <the planner's reason> -- fix: ..."), so that no rank waits forever
    //! for one that threw. Ranks whose chunks would move something are not let run without it.
    pipeline_model(const model_config& cfg, const capscope::pipeline::schedule_shape& shape, int rank, cudaStream_t setup_stream,
                   pipeline_slots slots = pipeline_slots::planned, const activation_offload& offload = {});
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
    //! A step of `microbatches` microbatches begins (0: model_config::microbatches; another count
    //! only with pipeline_slots::phased): gradients cleared, the microbatch counters (and their
    //! overrun flag) reset, and the loss gradient's 1/microbatches set in device memory.
    void begin_step(cudaStream_t s, int microbatches = 0);
    void set_optimizer(const adamw_config& opt, cudaStream_t s);
    //! Data parallelism across pipeline replicas: from now on every step averages each chunk's
    //! gradients over `replicas` (the ranks at this pipeline rank in every replica:
    //! capscope::split_pipeline_grid) after its passes and before AdamW, inside the step, so inside
    //! a captured one too. `replicas` (a capscope::cuda::nccl_communicator) outlives the model.
    template <class Communicator>
    void average_gradients_over(const Communicator& replicas) {
        replicas_ = &replicas;
        average_ = [](const void* comm, float* data, std::size_t count, cudaStream_t s) {
            static_cast<const Communicator*>(comm)->average_in_place(data, count, s);
        };
    }
    //! What a step does after its passes, in order: the gradients averaged over the replicas (if
    //! average_gradients_over was called), the before_optimizer step hooks, AdamW over every
    //! chunk's parameters (one step count for the rank), the after_optimizer step hooks. step()
    //! calls it; a step loop written by hand (begin_step, the passes) ends with it.
    void finish_step(cudaStream_t s) {
        average_over_replicas(s);
        capscope::run_forward(before_optimizer_, s);
        optimizer_step(s);
        capscope::run_forward(after_optimizer_, s);
    }

    //! Hooks on the passes (capscope::with_pass_hooks; rule H5 at compile time). A layer hook runs
    //! in the passes of the chunk that holds its layer: forward_pre in the forward pass and in a
    //! backward pass's recomputed forward, forward in the forward pass only, backward_pre and
    //! backward in the backward pass. Its context's parameters are the layer's working values, its
    //! gradients the layer's gradients, and its microbatch -1 (read on the device). Step hooks run
    //! once a step, in finish_step: before_optimizer after the replicas' average, after_optimizer
    //! after AdamW; their context holds this rank's layers only (the others' are empty), so a
    //! global norm needs a reduction over the pipeline of the hook's own. Every impl runs the hooks
    //! where it runs the passes and finish_step: eagerly, in the pass graphs, or in the whole
    //! step's graph. `hooks` outlives the model, and is set before the first step or pass (a graph
    //! captured earlier would keep the passes without them; refused after). A hook's kernels are
    //! the caller's to load before the first step (launch each once, or CUDA_MODULE_LOADING=EAGER),
    //! as the model loads its own: a lazy load may wait behind a receive whose sender waits for it.
    //! Nothing is changed when it throws.
    template <class... Hooks>
    void set_hooks(const capscope::hook_pipeline<Hooks...>& hooks) {
        static_assert(capscope::fits_pipelined_passes<capscope::hook_pipeline<Hooks...>>);
        bind_hook_tensors();
        std::vector<capscope::pass_stages> stages, copied; // the forward pass's; the backward pass's (with the offload copies)
        for (int c = 0; c < chunks(); ++c) {
            stages.push_back(capscope::with_pass_hooks(layer_stages(c), hooks, hook_tensors_));
            copied.push_back(capscope::with_pass_hooks(backward_pass_stages(c), hooks, hook_tensors_));
        }
        std::vector<capscope::stage> before = capscope::step_hook_stages(hooks, capscope::step_point::before_optimizer, hook_tensors_, hook_outside_);
        std::vector<capscope::stage> after = capscope::step_hook_stages(hooks, capscope::step_point::after_optimizer, hook_tensors_, hook_outside_);
        set_hook_stages(std::move(stages), std::move(copied), std::move(before), std::move(after)); // noexcept: moves only
    }
    //! The stages point into the hooks: a temporary would dangle.
    template <class... Hooks>
    void set_hooks(capscope::hook_pipeline<Hooks...>&&) = delete;
    //! Chunk `chunk`'s layer stages, without hooks (what a forward pass runs, with_pass_hooks' input).
    const std::vector<capscope::stage>& layer_stages(int chunk) const;
    //! The same with the offload policy's copies (what a backward pass recomputes and runs
    //! backwards); the layer stages without offload.
    const std::vector<capscope::stage>& backward_pass_stages(int chunk) const;
    //! Device and pinned host bytes of the chunks' kept tensors (their activation stores).
    std::size_t activation_device_bytes() const;
    std::size_t activation_host_bytes() const;

    //! A whole step on `stream`: begin_step, the passes with their sends and receives through
    //! `issuer` (a pipeline_p2p: `run`; a pipeline_pass_graphs: `step`), made for this shape,
    //! rank and microbatch count, then finish_step.
    //! With pipeline_slots::phased, the issuer's microbatch count is the step's.
    template <class Issuer>
    void step(Issuer& issuer, cudaStream_t stream) {
        const int microbatches = int(issuer.program().compute.size()) / (2 * chunks());
        if (!same_program(issuer.program(), microbatches))
            throw std::invalid_argument("gpt::pipeline_model::step: the issuer runs another program than this rank's (its passes, or "
                                        "its sends and receives, which place the slots) -- fix: make it for the same schedule_shape "
                                        "(grouping included), rank and microbatch count (model_config::microbatches)");
        begin_step(stream, microbatches);
        auto buffers = [this](const capscope::pipeline::p2p_op& op) { return buffer_of(op); };
        auto passes = [this](const capscope::pipeline::compute_action& a, cudaStream_t on) { pass(a, on); };
        if constexpr (requires { issuer.step(buffers, passes, stream); }) issuer.step(buffers, passes, stream);
        else issuer.run(buffers, passes, stream);
        finish_step(stream);
    }

    //! A step of `microbatches` microbatches replayed from phase graphs captured once
    //! (capscope::pipeline_phase_graphs, made for this shape and rank), with pipeline_slots::phased.
    //! The phases are captured at the first call, which must follow one eager step (NCCL opens
    //! its connections on the first send).
    template <class Phases>
    void step(Phases& phases, int microbatches, cudaStream_t stream) {
        if (!layout_ || phases.layout().chunk_slots != layout_->chunk_slots || phases.layout().gradient_offset != layout_->gradient_offset ||
            phases.layout().chunk_gradients != layout_->chunk_gradients)
            throw std::invalid_argument("gpt::pipeline_model::step: phase graphs address the phase layout's slots, and this model " +
                                        std::string(layout_ ? "was made for another shape or rank" : "addresses planned slots") +
                                        " -- fix: make the model with pipeline_slots::phased, for the phases' shape and rank");
        auto buffers = [this](const capscope::pipeline::p2p_op& op) { return buffer_of(op); };
        auto passes = [this](const capscope::pipeline::compute_action& a, cudaStream_t on) { pass(a, on); };
        if (phases.graphs_captured() == 0) phases.capture(buffers, passes, stream);
        begin_step(stream, microbatches);
        phases.launch(microbatches, stream);
        finish_step(stream);
    }

    //! Whether `p` is this rank's program of `microbatches` microbatches: the same rank, passes
    //! and groups of sends and receives (the slots follow from where the receives are issued).
    bool same_program(const capscope::pipeline::rank_program& p, int microbatches) const {
        const capscope::pipeline::rank_program& own =
            microbatches == cfg_.microbatches ? program_ : (other_program_ = capscope::pipeline::program_of(shape_, rank_, microbatches));
        if (!layout_ && microbatches != cfg_.microbatches) return false;
        if (p.rank != own.rank || p.compute != own.compute || p.groups.size() != own.groups.size()) return false;
        for (std::size_t g = 0; g < p.groups.size(); ++g) {
            const capscope::pipeline::p2p_group &a = p.groups[g], &b = own.groups[g];
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
    //! pipeline_slots::planned: the slots of model_config::microbatches.
    const capscope::pipeline::slot_plan& slots() const { return slots_; }
    //! pipeline_slots::phased: the phase layout; else null.
    const capscope::pipeline::phase_layout* layout() const { return layout_ ? &*layout_ : nullptr; }
    //! Device bytes of the slots (inputs and received gradients kept between passes).
    std::size_t slot_bytes() const;
    const model_config& config() const { return cfg_; }
    const capscope::pipeline::schedule_shape& shape() const { return shape_; }

private:
    struct chunk_state;
    chunk_state& at(int chunk) const;
    //! Where microbatch `mb` of chunk `chunk` waits: its input, and its received gradient.
    int activation_slot(int chunk, int mb) const;
    int gradient_slot(int chunk, int mb) const;
    void forward_of(chunk_state& c, int slot, cudaStream_t s, bool recompute);
    //! The chunk's backward after its forward: from `received` (the gradient of its output; the
    //! head computes its own), into its gradients and its send (or the embedding's gradients).
    void backward_of(chunk_state& c, int slot, const T* received, cudaStream_t s);
    void load_kernels(cudaStream_t s); //!< every pass's kernel launched once, before any send or receive
    void check_counters(cudaStream_t s) const; //!< throws when a chunk ran past its microbatches (synchronizes `s`)
    //! set_hooks' parts that need the chunks: every layer's tensors for the hooks (this rank's
    //! filled, the others empty; refused once a step or pass began), and the stages installed.
    void bind_hook_tensors();
    void set_hook_stages(std::vector<capscope::pass_stages> forward, std::vector<capscope::pass_stages> backward,
                         std::vector<capscope::stage> before_optimizer, std::vector<capscope::stage> after_optimizer) noexcept;
    //! The step's gradients averaged over the replicas, if average_gradients_over was called.
    void average_over_replicas(cudaStream_t s) {
        if (!average_ || capscope::detail::installed_breakage().skip_replica_average) return; // (a test, broken on purpose)
        for (int c = 0; c < chunks(); ++c) average_(replicas_, parameters(c).grads(), parameters(c).total(), s);
    }
    void optimizer_step(cudaStream_t s); //!< AdamW over every chunk's parameters (one step count for the rank)

    model_config cfg_;
    capscope::pipeline::schedule_shape shape_;
    int rank_;
    int first_stage_ = 0, last_stage_ = 0; //!< the virtual stages of the first and last chunk
    capscope::pipeline::rank_program program_;
    capscope::pipeline::slot_plan slots_;
    const void* replicas_ = nullptr;                                  //!< average_gradients_over's communicator
    void (*average_)(const void*, float*, std::size_t, cudaStream_t) = nullptr; //!< and how to average on it
    std::optional<capscope::pipeline::phase_layout> layout_; //!< pipeline_slots::phased
    mutable capscope::pipeline::rank_program other_program_; //!< phased: the program step() last compared with
    int step_microbatches_ = 0;                              //!< the step's count (begin_step)
    bool stepped_ = false;                                   //!< a step or a pass has begun (set_hooks is refused after)
    std::vector<capscope::tensor_ref> hook_values_, hook_gradients_; //!< what hook_tensors_ point into, one per layer
    std::vector<capscope::layer_tensors> hook_tensors_;     //!< per layer of the model (set_hooks)
    capscope::layer_buffers hook_outside_;                   //!< the gradients outside the layers (the step hooks' declared reach)
    std::vector<capscope::stage> before_optimizer_, after_optimizer_; //!< the step hooks
    std::vector<int> slot_of_, gradient_slot_of_; //!< per (chunk, microbatch)
    capscope::cuda::blas_handle blas_;
    std::vector<std::unique_ptr<chunk_state>> chunks_;
    std::vector<capscope::cuda::device_buffer<T>> gradient_slots_;
    capscope::cuda::device_buffer<int> device_step_;
    capscope::cuda::device_buffer<int> overrun_; //!< 1 once a chunk ran more forwards than microbatches since begin_step
    capscope::cuda::device_buffer<float> gradient_scale_; //!< 1 / the step's microbatches: the loss gradient's factor
    capscope::cuda::device_buffer<float> hyperparameters_;
    capscope::cuda::pinned_buffer<float> host_loss_;
};

} // namespace gpt
