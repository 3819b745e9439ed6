#pragma once
//! @file
//! Writes a model's fp32 master weights in the safetensors layout (an 8-byte little-endian header
//! length, a JSON header naming each tensor's dtype, shape and byte range, then the raw bytes), so
//! another framework can start from the same weights: the PyTorch peer in bench/peers/ reads it.
//! The header's `__metadata__` holds the model config, from which the peer builds the same model.

#include <gpt/model.hpp>

#include <string>
#include <vector>

namespace gpt {

//! Which fp32 arena to write: the master weights, or the gradients of the last step.
enum class saved_arena { masters, gradients };

//! Every parameter of `model` (replicated stores only), by its declared name, flat, fp32: its
//! master weight, or its gradient (the peer compares a step's gradients, which see the attention
//! scale and masking that early losses hardly do). Synchronizes `s`. Throws on a sharded store
//! or when the file cannot be written.
template <class T>
void save_parameters(const gpt_model<T>& model, const std::string& path, cudaStream_t s, saved_arena arena = saved_arena::masters);

//! The same file from host memory: each of `tensors` lies in `values` at its offset, in fp32,
//! and the header's metadata is `config`. save_parameters writes it after copying an arena down;
//! the peer's CPU check writes the float64 reference's weights with it
//! (tests/bench/peer_reference_case.cpp). Throws when the file cannot be written.
void write_safetensors(const std::string& path, const model_config& config, const std::vector<parameter_info>& tensors,
                       const float* values);

} // namespace gpt
