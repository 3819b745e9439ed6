#pragma once
// A float64 CPU reference of the example model and vision encoder, written from the maths,
// not from the CUDA code: no permutation buffers, no head splitting, no fused residuals. The
// gradient checks differentiate it by central differences.

#include <gpt/config.hpp>

#include <functional>
#include <map>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace reference {

using parameters = std::map<std::string, std::vector<double>>;

//! Mean next-token cross-entropy of the GPT model (labels -1 carry no loss).
double model_loss(const gpt::model_config& cfg, const parameters& p, const std::vector<int>& tokens, const std::vector<int>& labels);

//! The parameters model_loss reads, by name and element count, in the order the example model
//! declares them: what a caller must fill (the peer's CPU check draws them at random).
std::vector<std::pair<std::string, std::size_t>> model_parameters(const gpt::model_config& cfg);

//! Vision encoder output [batch * padded_len, hidden] for patches [batch * padded_len, patch_dim].
std::vector<double> vision_forward(const gpt::vision_config& cfg, const parameters& p, const std::vector<double>& patches,
                                   const std::vector<int>& lengths);

//! d f / d p for every element of every parameter, by central differences with step `h`
//! scaled to each value's magnitude.
parameters finite_difference_gradients(const parameters& p, const std::function<double(const parameters&)>& f);

//! The experts that MoE layer `moe_layer` routes each token to, [tokens * top_k], each token's
//! choices in descending logit order (ties to the lower id), as the router kernel writes them.
std::vector<int> routing_map(const gpt::model_config& cfg, const parameters& p, const std::vector<int>& tokens, int moe_layer);

//! Which (token, choice) assignments a drop-and-pad MoE layer keeps, for the layer's input
//! rows: used to assert the check really exercised dropped tokens.
int dropped_assignments(const gpt::model_config& cfg, const parameters& p, const std::vector<int>& tokens, int moe_layer);

} // namespace reference
