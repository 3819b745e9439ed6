#include <gpt/model.hpp>

#include "gemm.hpp"
#include "kernels.hpp"
#include "layers.hpp"

#include <capscope/cuda/error.hpp>

#include <stdexcept>
#include <string>

namespace gpt {

using capscope::cuda::device_buffer;
using detail::gemm;

template <class T>
gpt_model<T>::gpt_model(const model_config& cfg, cudaStream_t s, std::optional<store_sharding> sharding, const activation_offload& offload,
                        const collective_memory_source& collective_memory)
    : cfg_(detail::validated(cfg)), expert_overflow_(1), may_update_(1), skipped_at_start_(1), rng_at_start_(1), rng_(1), loss_scale_(1),
      loss_scale_at_start_(1) {
    kernels::set_rng(rng_.data(), cfg.seed, 0, s);
    kernels::set_loss_scale(loss_scale_.data(), cfg.loss_scale.dynamic ? cfg.loss_scale.initial : 1.f, s);
    kernels::set_int(expert_overflow_.data(), 0, s);
    kernels::set_int(may_update_.data(), 1, s);
    detail::model_layout<T> layout = detail::declare_model(cfg, /*training=*/true, params_, blas_, activations_, &scratch_, rng_.data(),
                                                           expert_overflow_.data());
    tok_emb_ = layout.tok_emb;
    pos_emb_ = layout.pos_emb;
    final_norm_ = layout.final_norm;
    head_w_ = layout.head_w;
    blocks_ = std::move(layout.blocks);

    const std::size_t t = cfg.tokens(), h = cfg.hidden, v = cfg.vocab, mbs = std::size_t(cfg.microbatches);
    tokens_ = device_buffer<int>(mbs * t);
    labels_ = device_buffer<int>(mbs * t);
    embedded_ = device_buffer<T>(t * h);
    final_normed_ = device_buffer<T>(t * h);
    logits_ = device_buffer<T>(t * v);
    d_logits_ = device_buffer<T>(t * v);
    d_final_normed_ = device_buffer<T>(t * h);
    d_last_ = device_buffer<T>(t * h);
    final_rstd_ = device_buffer<float>(t);
    row_loss_ = device_buffer<float>(t);
    loss_ = device_buffer<float>(mbs);
    valid_count_ = device_buffer<float>(1);
    hyperparameters_ = device_buffer<float>(sizeof(kernels::adamw_hyperparameters) / sizeof(float));
    device_step_ = device_buffer<int>(1);
    device_step_.fill_bytes(0, s);
    all_finite_ = device_buffer<int>(1);
    skipped_steps_ = device_buffer<int>(1);
    kernels::set_int(all_finite_.data(), 1, s);
    skipped_steps_.fill_bytes(0, s);
    host_loss_ = capscope::cuda::pinned_buffer<float>(mbs);
    tokens_.fill_bytes(0, s); // a valid token id until the first set_batch
    labels_.fill_bytes(0xff, s);
    loss_.fill_bytes(0, s);
    if (sharding && cfg.check_finite_on_device)
        throw std::invalid_argument("model_config::check_finite_on_device with sharded parameters: each rank would check only its own "
                                    "shard of the gradients and decide apart, so the ranks would diverge -- fix: check on the device "
                                    "with replicated parameters (their gradients are all-reduced first), or turn the check off");
    if (sharding) params_.allocate_sharded(cfg.seed, s, *sharding, collective_memory);
    else params_.allocate(cfg.seed, s, true, collective_memory);
    arenas_ = params_.optimizer_arenas();
    set_optimizer(adamw_config{}, s);
    activations_.allocate(offload.policy, offload.ring);
    scratch_.allocate();

    const T* x = bind_chain(blocks_, embedded_.data(), d_last_.data());
    std::vector<stage> layer_stages;
    for (const auto& b : blocks_)
        for (const auto& st : b->stages()) layer_stages.push_back(st);
    io_.reserve(mbs); // stages point into io_: its elements never move
    for (int mb = 0; mb < cfg.microbatches; ++mb) {
        io_.push_back({this, mb});
        const std::string suffix = cfg.microbatches > 1 ? ".mb" + std::to_string(mb) : "";
        std::vector<stage> list;
        stage embed;
        embed.name = "embedding" + suffix;
        embed.kind = stage_kind::embedding;
        embed.buffers_declared = true;
        embed.forward = stream_fn::of<&microbatch_io::embedding_forward>(&io_.back());
        embed.backward = stream_fn::of<&microbatch_io::embedding_backward>(&io_.back());
        embed.inputs = {{"tokens" + suffix, tokens(mb), t * sizeof(int)}};
        embed.outputs = {{"embedding.output", embedded_.data(), embedded_.bytes()}};
        list.push_back(std::move(embed));
        list.insert(list.end(), layer_stages.begin(), layer_stages.end());
        stage head;
        head.name = "head" + suffix;
        head.kind = stage_kind::head;
        head.buffers_declared = true;
        head.forward = stream_fn::of<&microbatch_io::head_forward>(&io_.back());
        head.backward = stream_fn::of<&microbatch_io::head_backward>(&io_.back());
        head.inputs = {{"head.input", const_cast<T*>(x), t * h * sizeof(T)}, {"labels" + suffix, labels(mb), t * sizeof(int)}};
        if (cfg.loss_scale.dynamic) head.inputs.push_back(loss_scale_ref());
        head.outputs = {{"loss" + suffix, loss_.data() + mb, sizeof(float)}};
        list.push_back(std::move(head));
        stages_.push_back(std::move(list));
    }
}

template <class T> int gpt_model<T>::checked(int microbatch) const {
    if (microbatch < 0 || microbatch >= cfg_.microbatches)
        throw std::out_of_range("gpt_model: microbatch " + std::to_string(microbatch) + " is outside [0, " +
                                std::to_string(cfg_.microbatches) + ") (model_config::microbatches)");
    return microbatch;
}

template <class T>
void gpt_model<T>::set_batch(int mb, std::span<const int> tokens_in, std::span<const int> labels_in, cudaStream_t s) {
    const std::size_t t = cfg_.tokens();
    checked(mb);
    detail::check_batch(cfg_, tokens_in, labels_in, "set_batch");
    CAPSCOPE_CHECK(cudaMemcpyAsync(tokens(mb), tokens_in.data(), t * sizeof(int), cudaMemcpyHostToDevice, s));
    CAPSCOPE_CHECK(cudaMemcpyAsync(labels(mb), labels_in.data(), t * sizeof(int), cudaMemcpyHostToDevice, s));
}

template <class T> void gpt_model<T>::forward(cudaStream_t s, int mb) {
    if (static_capacity())
        throw std::logic_error("gpt_model::forward: with a static dropless capacity (model_config::dropless_capacity_factor) the tokens past "
                               "it are dropped until the step is rerun, which only a capscope runner does -- fix: train with "
                               "capscope::runner<Config>(model.training_program()), or set dropless_capacity_factor to 0");
    capscope::run_forward(stages(mb), s);
}
template <class T> void gpt_model<T>::backward(cudaStream_t s, int mb) { capscope::run_backward(stages(mb), s); }

template <class T> void gpt_model<T>::set_optimizer(const adamw_config& o, cudaStream_t s) {
    kernels::set_adamw_hyperparameters(reinterpret_cast<kernels::adamw_hyperparameters*>(hyperparameters_.data()),
                                       {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, s);
}

template <class T> void gpt_model<T>::optimizer_step(cudaStream_t s) {
    bool first = true; // one arena, or (sharded) the replicated one and this rank's shard: one step count
    for (const optimizer_arena<T>& a : arenas_) {
        kernels::adamw(a.master, a.value, a.grad, a.first_moment, a.second_moment, long(a.count), device_step_.data(),
                       reinterpret_cast<const kernels::adamw_hyperparameters*>(hyperparameters_.data()), s, first, device_inverse_loss_scale());
        first = false;
    }
}

template <class T> void gpt_model<T>::check_finite_stage(cudaStream_t s) {
    kernels::set_int(all_finite_.data(), 1, s);
    kernels::clear_unless_finite(loss_.data(), long(loss_.size()), all_finite_.data(), s);
    for (const optimizer_arena<T>& a : arenas_) kernels::clear_unless_finite(a.grad, long(a.count), all_finite_.data(), s);
    kernels::count_if_cleared(all_finite_.data(), skipped_steps_.data(), s);
}

template <class T> void gpt_model<T>::begin_step_stage(cudaStream_t s) {
    zero_grad(s);
    if (!static_capacity()) return;
    // What a refused step advances, kept so that its rerun starts where it did.
    kernels::set_int(expert_overflow_.data(), 0, s);
    for (const step_snapshot& k : step_snapshots())
        if (k.bytes) CAPSCOPE_CHECK(cudaMemcpyAsync(k.at_start, k.live, k.bytes, cudaMemcpyDeviceToDevice, s));
}

template <class T> void gpt_model<T>::update_gate_stage(cudaStream_t s) {
    kernels::update_gate(expert_overflow_.data(), cfg_.check_finite_on_device ? all_finite_.data() : nullptr, may_update_.data(), s);
}

template <class T> void gpt_model<T>::update_loss_scale_stage(cudaStream_t s) {
    kernels::update_loss_scale(all_finite_.data(), loss_scale_.data(), cfg_.loss_scale.growth_interval, s);
}

template <class T> loss_scale_state gpt_model<T>::loss_scale(cudaStream_t s) const {
    loss_scale_state st;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&st, loss_scale_.data(), sizeof st, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return st;
}

template <class T> void gpt_model<T>::rerun_before(cudaStream_t s) {
    for (const step_snapshot& k : step_snapshots())
        if (k.bytes) CAPSCOPE_CHECK(cudaMemcpyAsync(k.live, k.at_start, k.bytes, cudaMemcpyDeviceToDevice, s));
    set_moe_host_sized(true);
}

template <class T> void gpt_model<T>::rerun_after(cudaStream_t) { set_moe_host_sized(false); }

template <class T> void gpt_model<T>::set_moe_host_sized(bool on) {
    for (const auto& b : blocks_)
        if (auto* moe = dynamic_cast<moe_block<T>*>(b.get())) moe->set_host_sized(on);
}

template <class T> int gpt_model<T>::skipped_steps(cudaStream_t s) const {
    int n = 0;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&n, skipped_steps_.data(), sizeof n, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return n;
}

template <class T> capscope::training_program gpt_model<T>::training_program() const {
    capscope::training_program p;
    auto* self = const_cast<gpt_model*>(this); // the program's functions change the model, as a step does
    stage zero;
    zero.name = "zero_grad";
    zero.kind = stage_kind::other;
    zero.buffers_declared = true;
    zero.forward = stream_fn::of<&gpt_model::begin_step_stage>(self);
    zero.outputs = params_.gradient_arenas();
    if (static_capacity()) {
        zero.outputs.push_back(expert_overflow());
        for (const step_snapshot& k : step_snapshots())
            if (k.bytes) {
                zero.inputs.push_back({k.name, k.live, k.bytes});
                zero.outputs.push_back({std::string(k.name) + " (at step start)", k.at_start, k.bytes});
            }
    }
    p.step_begin.push_back(std::move(zero));
    p.microbatches = stages_;
    stage opt;
    opt.name = "optimizer";
    opt.kind = stage_kind::optimizer;
    opt.buffers_declared = true;
    opt.forward = stream_fn::of<static_cast<void (gpt_model::*)(cudaStream_t)>(&gpt_model::optimizer_step)>(self);
    opt.inputs = params_.gradient_arenas();
    if (cfg_.loss_scale.dynamic) opt.inputs.push_back(loss_scale_ref()); // the gradients are divided by it
    if (cfg_.check_finite_on_device) {
        // The check reads the loss and every gradient the optimizer reads, and writes the flag
        // the optimizer is guarded by (and the count of skipped steps).
        stage check;
        check.name = "check_finite";
        check.kind = stage_kind::other;
        check.buffers_declared = true;
        check.forward = stream_fn::of<&gpt_model::check_finite_stage>(self);
        check.inputs = params_.gradient_arenas();
        check.inputs.push_back({"loss", loss_.data(), loss_.bytes()});
        check.outputs = {all_finite(), {"skipped_steps", skipped_steps_.data(), skipped_steps_.bytes()}};
        p.step_end.push_back(std::move(check));
        opt.guard = capscope::run_if(all_finite());
    }
    if (static_capacity()) {
        // A step in which an expert got more tokens than its static capacity moves no weight: the
        // runner reruns it eagerly, every expert sized by its count.
        stage gate;
        gate.name = "update_gate";
        gate.kind = stage_kind::other;
        gate.buffers_declared = true;
        gate.forward = stream_fn::of<&gpt_model::update_gate_stage>(self);
        gate.inputs = {expert_overflow()};
        if (cfg_.check_finite_on_device) gate.inputs.push_back(all_finite());
        gate.outputs = {may_update()};
        p.step_end.push_back(std::move(gate));
        opt.guard = capscope::run_if(may_update());
        p.rerun.flag = expert_overflow();
        p.rerun.before = stream_fn::of<&gpt_model::rerun_before>(self);
        p.rerun.after = stream_fn::of<&gpt_model::rerun_after>(self);
        p.rerun.reason = "an expert got more tokens than its static capacity";
    }
    p.step_end.push_back(std::move(opt));
    if (cfg_.loss_scale.dynamic) {
        // After the optimizer, which divided by the scale this step multiplied by; unguarded, as
        // a skipped step is what halves it.
        stage scale;
        scale.name = "update_loss_scale";
        scale.kind = stage_kind::other;
        scale.buffers_declared = true;
        scale.forward = stream_fn::of<&gpt_model::update_loss_scale_stage>(self);
        scale.inputs = {all_finite(), loss_scale_ref()};
        scale.outputs = {loss_scale_ref()};
        p.step_end.push_back(std::move(scale));
    }
    return p;
}

template <class T> float gpt_model<T>::loss(cudaStream_t s) const {
    CAPSCOPE_CHECK(cudaMemcpyAsync(host_loss_.data(), loss_.data(), loss_.bytes(), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    float sum = 0.f;
    for (int mb = 0; mb < cfg_.microbatches; ++mb) sum += host_loss_[std::size_t(mb)];
    return sum / float(cfg_.microbatches);
}

template <class T> float gpt_model<T>::microbatch_loss(cudaStream_t s, int mb) const {
    checked(mb);
    CAPSCOPE_CHECK(cudaMemcpyAsync(host_loss_.data(), loss_.data(), loss_.bytes(), cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return host_loss_[std::size_t(mb)];
}

template <class T> std::vector<const unsigned char*> gpt_model<T>::dropout_masks() const {
    std::vector<const unsigned char*> out;
    for (const auto& b : blocks_)
        if (const auto* mlp = dynamic_cast<const mlp_block<T>*>(b.get()); mlp && mlp->dropout_mask()) out.push_back(mlp->dropout_mask());
    return out;
}

template <class T> rng_state gpt_model<T>::generator(cudaStream_t s) const {
    rng_state r;
    CAPSCOPE_CHECK(cudaMemcpyAsync(&r, rng_.data(), sizeof r, cudaMemcpyDeviceToHost, s));
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    return r;
}

template <class T> const int* gpt_model<T>::expert_counts(int layer) const {
    if (layer >= 0 && layer < int(cfg_.layer_pattern.size()) && cfg_.layer_pattern[layer] == 'E')
        for (const auto& b : blocks_)
            if (auto* moe = dynamic_cast<const moe_block<T>*>(b.get()); moe && moe->stages().front().layer == layer)
                return moe->expert_counts();
    throw std::invalid_argument("expert_counts: layer " + std::to_string(layer) + " is not an MoE layer of pattern \"" +
                                cfg_.layer_pattern + "\"");
}

template <class T> void gpt_model<T>::embedding_forward(cudaStream_t s, int mb) {
    kernels::embedding_forward(tokens(mb), params_.value(tok_emb_), params_.value(pos_emb_), embedded_.data(), cfg_.batch,
                               cfg_.seq_len, cfg_.hidden, s);
}
template <class T> void gpt_model<T>::embedding_backward(cudaStream_t s, int mb) {
    kernels::embedding_backward(tokens(mb), blocks_.front()->input_grad(), params_.grad(tok_emb_), params_.grad(pos_emb_),
                                cfg_.vocab, cfg_.seq_len, cfg_.batch, cfg_.seq_len, cfg_.hidden, s);
}
template <class T> void gpt_model<T>::head_forward(cudaStream_t s, int mb) {
    const int t = cfg_.tokens(), h = cfg_.hidden, v = cfg_.vocab;
    kernels::rms_norm_forward(blocks_.back()->output(), params_.value(final_norm_), final_normed_.data(), final_rstd_.data(), t, h, s);
    gemm(blas_, s, {false, false, t, v, h}, final_normed_.data(), params_.value(head_w_), logits_.data());
    // The step's loss is the microbatches' mean: each microbatch's gradient is scaled by 1/microbatches.
    kernels::cross_entropy(logits_.data(), labels(mb), row_loss_.data(), loss_.data() + mb, valid_count_.data(), d_logits_.data(), t, v,
                           1.f / float(cfg_.microbatches), s, device_loss_scale());
}
template <class T> void gpt_model<T>::head_backward(cudaStream_t s, int) {
    const int t = cfg_.tokens(), h = cfg_.hidden, v = cfg_.vocab;
    const T* x = blocks_.back()->output();
    gemm(blas_, s, {true, false, h, v, t}, final_normed_.data(), d_logits_.data(), params_.grad(head_w_), 1.f);
    gemm(blas_, s, {false, true, t, h, v}, d_logits_.data(), params_.value(head_w_), d_final_normed_.data());
    kernels::rms_norm_weight_grad(x, final_rstd_.data(), d_final_normed_.data(), params_.grad(final_norm_), t, h, s);
    kernels::rms_norm_backward(x, params_.value(final_norm_), final_rstd_.data(), d_final_normed_.data(), static_cast<const T*>(nullptr),
                               d_last_.data(), t, h, s);
}

template class gpt_model<float>;
template class gpt_model<__nv_bfloat16>;
template class gpt_model<__half>;

} // namespace gpt
