#pragma once
// What the training model and the forward-only model share: the block shape of a model config,
// and its layer stack built from the layer pattern, in one parameter order (so the two models'
// parameter stores have one layout).

#include <gpt/blocks.hpp>
#include <gpt/config.hpp>

#include <memory>
#include <vector>

namespace gpt::detail {

block_shape shape_of(const model_config& c, bool training);

//! The blocks of `c.layer_pattern` ('D' attention + mlp, 'E' attention + moe, 'M' mamba), their
//! parameters declared in `params` in layer order.
template <class T>
std::vector<std::unique_ptr<block<T>>> make_layers(const model_config& c, const block_shape& shape, parameter_store<T>& params,
                                                   const capscope::cuda::blas_handle& blas);

} // namespace gpt::detail
