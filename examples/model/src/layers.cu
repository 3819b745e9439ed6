// The layer stack both models build: the checked config's block shape, and every parameter and
// block declared in one order (layers.hpp).

#include "layers.hpp"

#include <memory>
#include <stdexcept>
#include <string>

namespace gpt {

namespace detail {

block_shape shape_of(const model_config& c, bool training) {
    block_shape s;
    s.batch = c.batch;
    s.seq = c.seq_len;
    s.hidden = c.hidden;
    s.heads = c.heads;
    s.ffn_hidden = c.ffn_hidden;
    s.experts = c.experts;
    s.top_k = c.top_k;
    s.capacity_factor = c.capacity_factor;
    s.inner = c.inner();
    s.moe_mode = c.moe_mode;
    s.dropless_capacity_factor = c.dropless_capacity_factor;
    s.init_stddev = c.init_stddev;
    s.training = training;
    s.hidden_dropout = training ? c.hidden_dropout : 0.f;
    return s;
}

void check_batch(const model_config& c, std::span<const int> tokens, std::span<const int> labels, const char* who) {
    const std::size_t t = std::size_t(c.tokens());
    if (tokens.size() != t || labels.size() != t)
        throw std::invalid_argument(std::string(who) + ": expected " + std::to_string(t) + " tokens and labels (batch " + std::to_string(c.batch) +
                                    " x seq_len " + std::to_string(c.seq_len) + "), got " + std::to_string(tokens.size()) + " and " +
                                    std::to_string(labels.size()));
    for (std::size_t i = 0; i < t; ++i) {
        if (tokens[i] < 0 || tokens[i] >= c.vocab)
            throw std::out_of_range(std::string(who) + ": token " + std::to_string(tokens[i]) + " at " + std::to_string(i) +
                                    " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
        if (labels[i] < -1 || labels[i] >= c.vocab)
            throw std::out_of_range(std::string(who) + ": label " + std::to_string(labels[i]) + " at " + std::to_string(i) +
                                    " is neither -1 (no loss) nor in [0, " + std::to_string(c.vocab) + ")");
    }
}

template <class T>
model_layout<T> declare_model(const model_config& c, bool training, parameter_store<T>& params, const capscope::cuda::blas_handle& blas,
                              capscope::activation_store& activations, backward_scratch* scratch, rng_state* rng,
                              int* expert_overflow, const model_part& part) {
    model_layout<T> m;
    const int layers = int(c.layer_pattern.size()), end = part.end_layer < 0 ? layers : part.end_layer;
    if (part.first_layer < 0 || part.first_layer > end || end > layers)
        throw std::invalid_argument("declare_model: layers [" + std::to_string(part.first_layer) + ", " + std::to_string(end) +
                                    ") are not within the pattern's " + std::to_string(layers));
    if (part.embedding) {
        m.tok_emb = params.declare("embedding.tokens", std::size_t(c.vocab) * c.hidden, init_kind::normal, c.init_stddev);
        m.pos_emb = params.declare("embedding.positions", std::size_t(c.seq_len) * c.hidden, init_kind::normal, c.init_stddev);
    }
    block_shape sh = shape_of(c, training);
    sh.rng = rng;
    sh.expert_overflow = expert_overflow;
    if (sh.static_capacity() && !expert_overflow)
        throw std::invalid_argument("declare_model: a static dropless capacity needs the model's overflow flag"); // the training model passes it
    sh.activations = &activations;
    sh.scratch = scratch;
    for (std::size_t i = std::size_t(part.first_layer); i < std::size_t(end); ++i) {
        const std::string name = "layer" + std::to_string(i);
        const int layer = static_cast<int>(i);
        params.begin_layer(layer); // the layer's parameters form one group (sharded data parallelism shards it)
        switch (c.layer_pattern[i]) {
        case 'D':
            m.blocks.push_back(std::make_unique<attention_block<T>>(sh, params, blas, name, layer, attention_kind::causal));
            m.blocks.push_back(std::make_unique<mlp_block<T>>(sh, params, blas, name, layer));
            break;
        case 'E':
            m.blocks.push_back(std::make_unique<attention_block<T>>(sh, params, blas, name, layer, attention_kind::causal));
            m.blocks.push_back(std::make_unique<moe_block<T>>(sh, params, blas, name, layer));
            break;
        default: m.blocks.push_back(std::make_unique<mamba_block<T>>(sh, params, blas, name, layer)); break;
        }
    }
    params.begin_layer(-1);
    if (part.head) {
        m.final_norm = params.declare("final_norm", c.hidden, init_kind::ones);
        m.head_w = params.declare("lm_head", std::size_t(c.hidden) * c.vocab, init_kind::normal, c.init_stddev);
    }
    return m;
}
template model_layout<float> declare_model(const model_config&, bool, parameter_store<float>&, const capscope::cuda::blas_handle&,
                                           capscope::activation_store&, backward_scratch*, rng_state*, int*, const model_part&);
template model_layout<__nv_bfloat16> declare_model(const model_config&, bool, parameter_store<__nv_bfloat16>&, const capscope::cuda::blas_handle&,
                                                    capscope::activation_store&, backward_scratch*, rng_state*, int*, const model_part&);
template model_layout<__half> declare_model(const model_config&, bool, parameter_store<__half>&, const capscope::cuda::blas_handle&,
                                                    capscope::activation_store&, backward_scratch*, rng_state*, int*, const model_part&);

} // namespace detail

} // namespace gpt
