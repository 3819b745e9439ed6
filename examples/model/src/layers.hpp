#pragma once
// What the training model and the forward-only model share: the checked config, and every
// parameter and block of it declared in one order (so the two models' parameter stores have one
// layout, which load_parameters relies on).

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>

#include <memory>
#include <span>
#include <vector>

namespace gpt::detail {

//! `c`, after `c.validate()` (for a constructor's initializer list).
inline const model_config& validated(const model_config& c) {
    c.validate();
    return c;
}

block_shape shape_of(const model_config& c, bool training);

//! Throws unless `tokens` and `labels` are one microbatch of `c` (batch * seq_len each), every
//! token in the vocabulary and every label -1 (no loss) or in it; `who` starts the message.
void check_batch(const model_config& c, std::span<const int> tokens, std::span<const int> labels, const char* who);

//! The layers [first_layer, end_layer) of a model, with its embedding and its final norm and
//! LM head or without: what one pipeline chunk declares (gpt/pipeline.hpp). Layers keep their
//! index and name in the whole model. The default is the whole model.
struct model_part {
    int first_layer = 0;
    int end_layer = -1; //!< -1: the pattern's end
    bool embedding = true, head = true;
};

//! Ids of the parameters outside the layers; a part without its embedding (or head) has none.
template <class T>
struct model_layout {
    typename parameter_store<T>::id tok_emb, pos_emb, final_norm, head_w;
    std::vector<std::unique_ptr<block<T>>> blocks;
};

//! Declares the model's parameters in `params` (embeddings, then each layer of `c.layer_pattern`:
//! 'D' attention + mlp, 'E' attention + moe, 'M' mamba; then the final norm and the LM head) and
//! builds its blocks (of `part` only), with gradient buffers when `training` (and dropout from `rng`, a training
//! model's generator state in device memory). The blocks declare what they keep for their
//! backward in `activations` and take their backward's working memory from `scratch` (training
//! only), both of which the model allocates before it binds them.
template <class T>
model_layout<T> declare_model(const model_config& c, bool training, parameter_store<T>& params, const capscope::cuda::blas_handle& blas,
                              capscope::activation_store& activations, backward_scratch* scratch, rng_state* rng = nullptr,
                              int* expert_overflow = nullptr, const model_part& part = {});

} // namespace gpt::detail
