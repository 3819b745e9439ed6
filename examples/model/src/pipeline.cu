// One pipeline rank's chunks of the example model (gpt/pipeline.hpp).

#include <gpt/pipeline.hpp>

#include "gemm.hpp"
#include "kernels.hpp"
#include "layers.hpp"
#include "pipeline_offload_plan.hpp"

#include <capscope/cuda/error.hpp>
#include <capscope/stage/stage.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace gpt {

using capscope::cuda::device_buffer;
using detail::gemm;
namespace pl = capscope::pipeline;

//! A chunk: its layers (and the embedding or the head where its stage has them), its own
//! parameters and blocks, the slots that keep its microbatches' inputs, and its sends' buffers.
template <class T>
struct pipeline_model<T>::chunk_state {
    int virtual_stage = 0, first_layer = 0, end_layer = 0;
    bool embedding = false, head = false;
    parameter_store<T> params;
    capscope::activation_store activations;
    backward_scratch scratch;
    detail::model_layout<T> layout;
    std::vector<stage> layer_stages;
    std::vector<stage> copied_stages; //!< the layer stages with the offload copies (the layer stages without offload)
    //! What its passes run, with the hooks (set_hooks): a forward pass, the layer stages; a
    //! backward pass, the copied stages, recomputed without the forward hooks, then backwards.
    std::vector<stage> forward_pass, recomputed, backward_pass;
    std::vector<optimizer_arena<T>> arenas;
    //! The first block's input: the embedding's output, or a received activation copied from its slot.
    device_buffer<T> input;
    //! The gradient of the chunk's output (the last block's dy): the head's, or a received one copied from its slot.
    device_buffer<T> d_output;
    device_buffer<T> send_activation, send_gradient; //!< written only by the pass that computes the send
    std::vector<device_buffer<T>> activation_slots;  //!< received activations (stages after the first)
    std::vector<device_buffer<int>> token_slots, label_slots; //!< stage 0's tokens; the last stage's labels
    device_buffer<int> tokens, labels, counter;      //!< every microbatch's (what this stage reads); the next microbatch
    device_buffer<T> final_normed, logits, d_logits, d_final_normed; //!< the head's
    device_buffer<float> final_rstd, row_loss, pass_loss, valid_count, loss;
    const T* output() const { return layout.blocks.back()->output(); }
};

namespace {
const model_config& checked_for_pipeline(const model_config& c, const pl::schedule_shape& shape, int rank) {
    c.validate();
    const auto refuse = [](const std::string& what) { throw std::invalid_argument("gpt::pipeline_model: " + what); };
    if (shape.layers != int(c.layer_pattern.size()))
        refuse("the schedule splits " + std::to_string(shape.layers) + " layers, the pattern \"" + c.layer_pattern + "\" has " +
               std::to_string(c.layer_pattern.size()) + " -- fix: schedule_shape::layers = model_config::layer_pattern.size()");
    pl::require_rules(shape, c.microbatches);
    if (rank < 0 || rank >= shape.ranks)
        refuse("rank " + std::to_string(rank) + " of a " + std::to_string(shape.ranks) + "-rank schedule -- fix: 0 <= rank < shape.ranks");
    if (c.hidden_dropout > 0.f)
        refuse("hidden_dropout > 0: a backward recomputes its forward, which would draw other dropout masks -- fix: hidden_dropout = 0");
    if (c.moe_mode == moe_mode::dropless && c.layer_pattern.find('E') != std::string::npos)
        refuse("dropless MoE reads its expert counts on the host, which a captured pass cannot -- fix: moe_mode::drop_and_pad");
    if (c.check_finite_on_device || c.loss_scale.dynamic)
        refuse("the finite check and loss scaling decide per rank, and the ranks would diverge -- fix: turn them off (check_finite_on_device, "
               "loss_scale.dynamic)");
    return c;
}

} // namespace

template <class T>
pipeline_model<T>::pipeline_model(const model_config& cfg, const pl::schedule_shape& shape, int rank, cudaStream_t s, pipeline_slots addressing,
                                  const activation_offload& offload)
    : cfg_(checked_for_pipeline(cfg, shape, rank)), shape_(shape), rank_(rank), program_(pl::program_of(shape, rank, cfg.microbatches)),
      slots_(pl::plan_slots(shape, rank, cfg.microbatches)), step_microbatches_(cfg.microbatches), device_step_(1), overrun_(1), gradient_scale_(1),
      hyperparameters_(sizeof(kernels::adamw_hyperparameters) / sizeof(float)), host_loss_(std::size_t(cfg.microbatches)) {
    const std::size_t t = std::size_t(cfg.tokens()), h = std::size_t(cfg.hidden), v = std::size_t(cfg.vocab);
    const std::size_t mbs = std::size_t(cfg.microbatches), chunk_count = std::size_t(shape.virtual_stages);
    slot_of_.assign(chunk_count * mbs, -1);
    gradient_slot_of_.assign(chunk_count * mbs, -1);
    for (const pl::slot_use& u : slots_.uses) slot_of_[std::size_t(u.chunk) * mbs + std::size_t(u.microbatch)] = u.slot;
    for (const pl::gradient_use& u : slots_.gradients) gradient_slot_of_[std::size_t(u.chunk) * mbs + std::size_t(u.microbatch)] = u.slot;
    if (std::is_same_v<T, __half>)
        throw std::invalid_argument("gpt::pipeline_model<__half>: fp16 needs dynamic loss scaling, which the pipelined model does not have "
                                    "(its ranks would decide apart) -- fix: bf16 or fp32");
    // A pass finds its microbatch by counting its chunk's forwards, so they must come in microbatch order.
    std::vector<int> next_forward(chunk_count, 0);
    for (const pl::compute_action& a : program_.compute)
        if (a.direction == pl::pass::forward && a.microbatch != next_forward[std::size_t(a.chunk)]++)
            throw std::logic_error("gpt::pipeline_model: rank " + std::to_string(rank) + "'s program runs " + pl::describe(a) +
                                   " out of microbatch order, which the device counter cannot follow");
    overrun_.fill_bytes(0, s);
    if (addressing == pipeline_slots::phased) {
        layout_ = pl::phase_layout_of(shape, rank); // refuses gpipe and other groupings, naming the fix
        if (!layout_->serves(cfg.microbatches))
            throw std::invalid_argument("gpt::pipeline_model: with pipeline_slots::phased, model_config::microbatches (" +
                                        std::to_string(cfg.microbatches) + ") is the most a step may have, and the phases serve from " +
                                        std::to_string(layout_->least_microbatches) +
                                        (layout_->group > 1 ? " in whole groups of " + std::to_string(layout_->group) : std::string()) +
                                        " -- fix: a count the phases serve");
    }
    // Before any chunk allocates: every rank plans every stage, so a policy that one stage's chunk
    // refuses is refused by every rank alike (else the others would wait for it in a receive).
    const std::vector<capscope::offload_plan> stage_plans =
        offload.policy.enabled ? detail::plan_every_stage<T>(cfg, shape, offload, blas_) : std::vector<capscope::offload_plan>{};
    const int per_chunk = shape.layers_per_chunk();
    for (int chunk = 0; chunk < shape.virtual_stages; ++chunk) {
        auto c = std::make_unique<chunk_state>();
        c->virtual_stage = shape.stage_of(rank, chunk);
        c->first_layer = c->virtual_stage * per_chunk;
        c->end_layer = c->first_layer + per_chunk;
        c->embedding = c->virtual_stage == 0;
        c->head = c->virtual_stage == shape.stages() - 1;
        c->layout = detail::declare_model(cfg, /*training=*/true, c->params, blas_, c->activations, &c->scratch, nullptr, nullptr,
                                          detail::model_part{c->first_layer, c->end_layer, c->embedding, c->head});
        c->params.allocate(cfg.seed + std::uint64_t(c->virtual_stage), s);
        c->arenas = c->params.optimizer_arenas();
        c->activations.allocate(offload.policy, offload.ring);
        if (offload.policy.enabled) {
            // The dry run must be this plan: else another rank may have planned a stage that refuses.
            const capscope::offload_plan &real = c->activations.plan(), &dry = stage_plans[std::size_t(c->virtual_stage)];
            if (real.tensors.size() != dry.tensors.size() || real.copied_groups() != dry.copied_groups() || real.ring_bytes != dry.ring_bytes ||
                real.own_bytes != dry.own_bytes || real.host_bytes != dry.host_bytes)
                throw std::logic_error("gpt::pipeline_model: the offload dry run of virtual stage " + std::to_string(c->virtual_stage) +
                                       " planned other tensors than its chunk declares (a layer's kept tensors depend on more than its "
                                       "kind) -- fix: plan_every_stage (pipeline_offload_plan.hpp) must declare each stage as its chunk does");
        }
        c->scratch.allocate();
        c->input = device_buffer<T>(t * h);
        c->d_output = device_buffer<T>(t * h);
        bind_chain(c->layout.blocks, c->input.data(), c->d_output.data());
        for (const auto& b : c->layout.blocks)
            for (const auto& st : b->stages()) c->layer_stages.push_back(st);
        c->copied_stages = c->layer_stages;
        if (offload.policy.enabled) {
            // A pass is one list on one stream, captured whole or run eagerly: the copies are
            // placed as for a whole-step graph, and run in list order.
            capscope::training_program one;
            one.microbatches.push_back(c->layer_stages);
            c->copied_stages = c->activations.with_offload(one, capscope::capture_scope{capscope::graph_impl::whole_iteration, {}}).microbatches.front();
            if (capscope::detail::installed_breakage().skip_pass_copy_back) // (a test, broken on purpose)
                std::erase_if(c->copied_stages, [](const stage& st) { return st.name.ends_with(".to_device"); });
        }
        c->forward_pass = c->layer_stages;
        c->recomputed = c->backward_pass = c->copied_stages;
        const int slot_count = layout_ ? layout_->chunk_slots[std::size_t(chunk)] : slots_.slots[std::size_t(chunk)];
        if (c->embedding) {
            c->tokens = device_buffer<int>(mbs * t);
            c->tokens.fill_bytes(0, s); // a valid token id until set_batch
            for (int k = 0; k < slot_count; ++k) c->token_slots.emplace_back(t);
        } else {
            c->send_gradient = device_buffer<T>(t * h);
            for (int k = 0; k < slot_count; ++k) c->activation_slots.emplace_back(t * h);
        }
        if (c->head) {
            c->labels = device_buffer<int>(mbs * t);
            c->labels.fill_bytes(0xff, s); // no loss until set_batch
            for (int k = 0; k < slot_count; ++k) c->label_slots.emplace_back(t);
            c->final_normed = device_buffer<T>(t * h);
            c->logits = device_buffer<T>(t * v);
            c->d_logits = device_buffer<T>(t * v);
            c->d_final_normed = device_buffer<T>(t * h);
            c->final_rstd = device_buffer<float>(t);
            c->row_loss = device_buffer<float>(t);
            c->pass_loss = device_buffer<float>(1);
            c->valid_count = device_buffer<float>(1);
            c->loss = device_buffer<float>(mbs);
            c->loss.fill_bytes(0, s);
        } else {
            c->send_activation = device_buffer<T>(t * h);
        }
        if (c->embedding || c->head) c->counter = device_buffer<int>(1);
        chunks_.push_back(std::move(c));
    }
    first_stage_ = chunks_.front()->virtual_stage;
    last_stage_ = chunks_.back()->virtual_stage;
    for (int k = 0; k < (layout_ ? layout_->gradient_slots : slots_.gradient_slots); ++k) gradient_slots_.emplace_back(t * h);
    device_step_.fill_bytes(0, s);
    kernels::set_float(gradient_scale_.data(), 1.f / float(cfg.microbatches), s);
    set_optimizer(adamw_config{}, s);
    load_kernels(s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
}

template <class T> void pipeline_model<T>::load_kernels(cudaStream_t s) {
    // CUDA loads a kernel's module at its first launch (lazy loading, the default), and a load may
    // wait for the kernels running on the GPU. If one of them is an NCCL receive whose sender waits
    // for this rank's later work, the two ranks deadlock on the first step (seen on 2 H200s). So
    // every kernel of the passes runs once here, before any send or receive: a forward and a
    // backward of each chunk from its first slot, zeroed, whose gradients, counter and loss are
    // then cleared. Not all on zeros: with offload, the backward's copies back (to_device) copy
    // pinned host memory that nothing has written (the forward pass copies nothing out), so that
    // backward reads whatever the pool held. Harmless: what it computes goes to the gradients,
    // cleared below, and to buffers that every pass writes before it reads them.
    for (const auto& c : chunks_) {
        if (c->embedding) c->token_slots.front().fill_bytes(0, s);
        else c->activation_slots.front().fill_bytes(0, s);
        if (c->head) c->label_slots.front().fill_bytes(0, s);
        c->d_output.fill_bytes(0, s);
        forward_of(*c, 0, s, /*recompute=*/false); // the counter's kernels too: undone below
        backward_of(*c, 0, c->d_output.data(), s);
        c->params.zero_grads(s);
        if (c->embedding || c->head) c->counter.fill_bytes(0, s);
        if (c->head) c->loss.fill_bytes(0, s);
    }
}

template <class T> pipeline_model<T>::~pipeline_model() = default;

template <class T> typename pipeline_model<T>::chunk_state& pipeline_model<T>::at(int chunk) const {
    if (chunk < 0 || chunk >= int(chunks_.size()))
        throw std::out_of_range("gpt::pipeline_model: chunk " + std::to_string(chunk) + " is outside [0, " + std::to_string(chunks_.size()) + ")");
    return *chunks_[std::size_t(chunk)];
}

template <class T> int pipeline_model<T>::activation_slot(int chunk, int mb) const {
    if (layout_) return layout_->activation_slot(chunk, mb);
    return slot_of_[std::size_t(chunk) * std::size_t(cfg_.microbatches) + std::size_t(mb)];
}
template <class T> int pipeline_model<T>::gradient_slot(int chunk, int mb) const {
    if (layout_) return layout_->gradient_slot(chunk, mb);
    return gradient_slot_of_[std::size_t(chunk) * std::size_t(cfg_.microbatches) + std::size_t(mb)];
}

template <class T> int pipeline_model<T>::first_layer(int chunk) const { return at(chunk).first_layer; }
template <class T> int pipeline_model<T>::end_layer(int chunk) const { return at(chunk).end_layer; }
template <class T> parameter_store<T>& pipeline_model<T>::parameters(int chunk) { return at(chunk).params; }
template <class T> const parameter_store<T>& pipeline_model<T>::parameters(int chunk) const { return at(chunk).params; }

template <class T>
void pipeline_model<T>::set_batch(int mb, std::span<const int> tokens_in, std::span<const int> labels_in, cudaStream_t s) {
    const std::size_t t = std::size_t(cfg_.tokens());
    if (mb < 0 || mb >= cfg_.microbatches)
        throw std::out_of_range("gpt::pipeline_model::set_batch: microbatch " + std::to_string(mb) + " is outside [0, " +
                                std::to_string(cfg_.microbatches) + ") (model_config::microbatches)");
    detail::check_batch(cfg_, tokens_in, labels_in, "gpt::pipeline_model::set_batch");
    for (const auto& c : chunks_) {
        if (c->embedding)
            CAPSCOPE_CHECK(cudaMemcpyAsync(c->tokens.data() + std::size_t(mb) * t, tokens_in.data(), t * sizeof(int), cudaMemcpyHostToDevice, s));
        if (c->head)
            CAPSCOPE_CHECK(cudaMemcpyAsync(c->labels.data() + std::size_t(mb) * t, labels_in.data(), t * sizeof(int), cudaMemcpyHostToDevice, s));
    }
}

template <class T> capscope::p2p_buffer pipeline_model<T>::buffer_of(const pl::p2p_op& op) const {
    const std::size_t bytes = std::size_t(cfg_.tokens()) * std::size_t(cfg_.hidden) * sizeof(T);
    const std::size_t mbs = std::size_t(cfg_.microbatches);
    const bool activation = op.m.what == pl::carries::activation;
    // The message names the stage that receives it; a send's own stage is the one before (an
    // activation) or after (a gradient).
    const int own_stage = op.send ? op.m.stage + (activation ? -1 : 1) : op.m.stage;
    const int chunk = shape_.chunk_of(own_stage);
    chunk_state& c = at(chunk);
    if (op.send) return {activation ? c.send_activation.data() : c.send_gradient.data(), bytes};
    if (op.m.microbatch < 0 || (!layout_ && std::size_t(op.m.microbatch) >= mbs))
        throw std::out_of_range("gpt::pipeline_model::buffer_of: microbatch " + std::to_string(op.m.microbatch) + " is outside the model's " +
                                std::to_string(mbs));
    if (activation) return {c.activation_slots.at(std::size_t(activation_slot(chunk, op.m.microbatch))).data(), bytes};
    return {gradient_slots_.at(std::size_t(gradient_slot(chunk, op.m.microbatch))).data(), bytes};
}

template <class T> void pipeline_model<T>::forward_of(chunk_state& c, int k, cudaStream_t s, bool recompute) {
    const int t = cfg_.tokens(), h = cfg_.hidden, v = cfg_.vocab;
    const std::size_t slot = std::size_t(k);
    if (c.embedding) {
        if (!recompute) kernels::copy_row_at(c.tokens.data(), c.counter.data(), cfg_.microbatches, c.token_slots[slot].data(), t, overrun_.data(), s);
        kernels::embedding_forward(c.token_slots[slot].data(), c.params.value(c.layout.tok_emb), c.params.value(c.layout.pos_emb),
                                   c.input.data(), cfg_.batch, cfg_.seq_len, h, s);
    } else {
        CAPSCOPE_CHECK(cudaMemcpyAsync(c.input.data(), c.activation_slots[slot].data(), c.input.bytes(), cudaMemcpyDeviceToDevice, s));
    }
    capscope::run_forward(recompute ? c.recomputed : c.forward_pass, s);
    if (c.head) {
        if (!recompute) kernels::copy_row_at(c.labels.data(), c.counter.data(), cfg_.microbatches, c.label_slots[slot].data(), t, overrun_.data(), s);
        kernels::rms_norm_forward(c.output(), c.params.value(c.layout.final_norm), c.final_normed.data(), c.final_rstd.data(), t, h, s);
        gemm(blas_, s, {false, false, t, v, h}, c.final_normed.data(), c.params.value(c.layout.head_w), c.logits.data());
        // The step's loss is the microbatches' mean: each microbatch's gradient is scaled by 1/microbatches.
        // 1 / the step's microbatches from device memory (begin_step), so a graph serves any count:
        // times 1 and then the factor, the same bits as the factor alone.
        kernels::cross_entropy(c.logits.data(), c.label_slots[slot].data(), c.row_loss.data(), c.pass_loss.data(), c.valid_count.data(),
                               c.d_logits.data(), t, v, 1.f, s, gradient_scale_.data());
        if (!recompute) kernels::store_at(c.pass_loss.data(), c.counter.data(), cfg_.microbatches, c.loss.data(), overrun_.data(), s);
    }
    if (recompute) return;
    if (!c.head)
        CAPSCOPE_CHECK(cudaMemcpyAsync(c.send_activation.data(), c.output(), c.send_activation.bytes(), cudaMemcpyDeviceToDevice, s));
    if (c.embedding || c.head) kernels::increment(c.counter.data(), s);
}

template <class T> void pipeline_model<T>::pass(const pl::compute_action& a, cudaStream_t s) {
    chunk_state& c = at(a.chunk);
    // (Phased, a phase is captured from the program of a count it serves, which may exceed the
    // model's: its slots repeat, and the counter bounds what it reads.)
    if (a.microbatch < 0 || (!layout_ && (a.microbatch >= cfg_.microbatches || activation_slot(a.chunk, a.microbatch) < 0)))
        throw std::out_of_range("gpt::pipeline_model::pass: " + pl::describe(a) + " is not in this rank's program");
    const int k = activation_slot(a.chunk, a.microbatch);
    stepped_ = true; // (a graph captured from a pass keeps the hooks it ran with: set_hooks is refused from now on)
    if (a.direction == pl::pass::forward) {
        forward_of(c, k, s, false);
        return;
    }
    forward_of(c, k, s, true); // full recomputation: the chunk's activations are this microbatch's again
    const T* received = c.head ? nullptr : gradient_slots_.at(std::size_t(gradient_slot(a.chunk, a.microbatch))).data();
    backward_of(c, k, received, s);
}

template <class T> void pipeline_model<T>::backward_of(chunk_state& c, int k, const T* received, cudaStream_t s) {
    const int t = cfg_.tokens(), h = cfg_.hidden, v = cfg_.vocab;
    if (c.head) {
        const T* x = c.output();
        gemm(blas_, s, {true, false, h, v, t}, c.final_normed.data(), c.d_logits.data(), c.params.grad(c.layout.head_w), 1.f);
        gemm(blas_, s, {false, true, t, h, v}, c.d_logits.data(), c.params.value(c.layout.head_w), c.d_final_normed.data());
        kernels::rms_norm_weight_grad(x, c.final_rstd.data(), c.d_final_normed.data(), c.params.grad(c.layout.final_norm), t, h, s);
        kernels::rms_norm_backward(x, c.params.value(c.layout.final_norm), c.final_rstd.data(), c.d_final_normed.data(),
                                   static_cast<const T*>(nullptr), c.d_output.data(), t, h, s);
    } else if (received != c.d_output.data()) {
        CAPSCOPE_CHECK(cudaMemcpyAsync(c.d_output.data(), received, c.d_output.bytes(), cudaMemcpyDeviceToDevice, s));
    }
    capscope::run_backward(c.backward_pass, s);
    const T* dx = c.layout.blocks.front()->input_grad();
    if (c.embedding)
        kernels::embedding_backward(c.token_slots[std::size_t(k)].data(), dx, c.params.grad(c.layout.tok_emb), c.params.grad(c.layout.pos_emb),
                                    cfg_.vocab, cfg_.seq_len, cfg_.batch, cfg_.seq_len, h, s);
    else
        CAPSCOPE_CHECK(cudaMemcpyAsync(c.send_gradient.data(), dx, c.send_gradient.bytes(), cudaMemcpyDeviceToDevice, s));
}

template <class T> void pipeline_model<T>::begin_step(cudaStream_t s, int microbatches) {
    const int m = microbatches == 0 ? cfg_.microbatches : microbatches;
    if (m != cfg_.microbatches && !(layout_ && m <= cfg_.microbatches && layout_->serves(m)))
        throw std::invalid_argument("gpt::pipeline_model::begin_step: " + std::to_string(m) + " microbatches, and this model runs " +
                                    (layout_ ? "the counts its phases serve from " + std::to_string(layout_->least_microbatches) + " up to " +
                                                   std::to_string(cfg_.microbatches)
                                             : std::to_string(cfg_.microbatches) + " only") +
                                    " -- fix: " + (layout_ ? "a count in that range" : "pipeline_slots::phased, for counts that change"));
    kernels::set_float(gradient_scale_.data(), 1.f / float(m), s); // every step: a captured step holds its own count
    step_microbatches_ = m;
    stepped_ = true;
    overrun_.fill_bytes(0, s);
    for (const auto& c : chunks_) {
        c->params.zero_grads(s);
        if (c->embedding || c->head) c->counter.fill_bytes(0, s);
    }
}

template <class T> const std::vector<capscope::stage>& pipeline_model<T>::layer_stages(int chunk) const { return at(chunk).layer_stages; }
template <class T> const std::vector<capscope::stage>& pipeline_model<T>::backward_pass_stages(int chunk) const { return at(chunk).copied_stages; }
template <class T> std::size_t pipeline_model<T>::activation_device_bytes() const {
    std::size_t bytes = 0;
    for (const auto& c : chunks_) bytes += c->activations.device_bytes();
    return bytes;
}
template <class T> std::size_t pipeline_model<T>::activation_host_bytes() const {
    std::size_t bytes = 0;
    for (const auto& c : chunks_) bytes += c->activations.host_bytes();
    return bytes;
}

template <class T> void pipeline_model<T>::bind_hook_tensors() {
    if (stepped_)
        throw std::logic_error("gpt::pipeline_model::set_hooks: a step or a pass has begun, and a graph captured from the passes would keep "
                               "them without the hooks -- fix: set the hooks before the first step");
    const std::size_t layers = cfg_.layer_pattern.size();
    hook_values_.assign(layers, {});
    hook_gradients_.assign(layers, {});
    hook_tensors_.assign(layers, {});
    hook_outside_ = {};
    for (const auto& c : chunks_) {
        for (int l = c->first_layer; l < c->end_layer; ++l) {
            const std::size_t i = std::size_t(l);
            hook_values_[i] = c->params.layer_values(l);
            hook_gradients_[i] = c->params.layer_gradients(l);
            hook_tensors_[i] = {std::span<const capscope::tensor_ref>(&hook_values_[i], 1), std::span<const capscope::tensor_ref>(&hook_gradients_[i], 1)};
        }
        for (const capscope::tensor_ref& g : c->params.gradients_outside_layers()) hook_outside_.gradients.push_back(g);
    }
}

template <class T>
void pipeline_model<T>::set_hook_stages(std::vector<capscope::pass_stages> forward, std::vector<capscope::pass_stages> backward,
                                        std::vector<capscope::stage> before_optimizer, std::vector<capscope::stage> after_optimizer) noexcept {
    for (std::size_t k = 0; k < chunks_.size(); ++k) {
        chunk_state& c = *chunks_[k];
        c.forward_pass = std::move(forward[k].passes);
        c.backward_pass = std::move(backward[k].passes);
        // (A test, broken on purpose: the forward hooks in the recomputed forward too.)
        if (capscope::detail::installed_breakage().recompute_forward_hooks) c.recomputed = c.backward_pass;
        else c.recomputed = std::move(backward[k].recomputed);
    }
    before_optimizer_ = std::move(before_optimizer);
    after_optimizer_ = std::move(after_optimizer);
}

template <class T> void pipeline_model<T>::set_optimizer(const adamw_config& o, cudaStream_t s) {
    kernels::set_adamw_hyperparameters(reinterpret_cast<kernels::adamw_hyperparameters*>(hyperparameters_.data()),
                                       {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, s);
}

template <class T> void pipeline_model<T>::optimizer_step(cudaStream_t s) {
    bool first = true; // one step count for the rank's chunks
    for (const auto& c : chunks_)
        for (const optimizer_arena<T>& a : c->arenas) {
            kernels::adamw(a.master, a.value, a.grad, a.first_moment, a.second_moment, long(a.count), device_step_.data(),
                           reinterpret_cast<const kernels::adamw_hyperparameters*>(hyperparameters_.data()), s, first);
            first = false;
        }
}

template <class T> float pipeline_model<T>::loss(cudaStream_t s) const {
    if (!has_last_stage())
        throw std::logic_error("gpt::pipeline_model::loss: rank " + std::to_string(rank_) + " does not hold the last stage, where the loss is "
                               "computed -- fix: ask rank " + std::to_string(shape_.rank_of(shape_.stages() - 1)));
    const chunk_state& c = *chunks_.back();
    CAPSCOPE_CHECK(cudaMemcpyAsync(host_loss_.data(), c.loss.data(), c.loss.bytes(), cudaMemcpyDeviceToHost, s));
    check_counters(s);
    float sum = 0.f;
    for (int mb = 0; mb < step_microbatches_; ++mb) sum += host_loss_[std::size_t(mb)];
    return sum / float(step_microbatches_);
}

template <class T> void pipeline_model<T>::check_counters(cudaStream_t s) const {
    int overrun = 0;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&overrun, overrun_.data(), sizeof overrun, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    if (overrun)
        throw std::logic_error("gpt::pipeline_model: a chunk ran more forwards than model_config::microbatches (" +
                               std::to_string(cfg_.microbatches) + ") since its counter was reset, and they read no microbatch -- fix: "
                               "begin each step with begin_step (step() does), and give the issuer the model's microbatch count");
}

template <class T> std::size_t pipeline_model<T>::slot_bytes() const {
    std::size_t bytes = 0;
    for (const auto& g : gradient_slots_) bytes += g.bytes();
    for (const auto& c : chunks_) {
        for (const auto& b : c->activation_slots) bytes += b.bytes();
        for (const auto& b : c->token_slots) bytes += b.bytes();
        for (const auto& b : c->label_slots) bytes += b.bytes();
    }
    return bytes;
}

template class pipeline_model<float>;
template class pipeline_model<__nv_bfloat16>;
template class pipeline_model<__half>;

} // namespace gpt
