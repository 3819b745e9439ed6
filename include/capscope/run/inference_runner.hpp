#pragma once
//! @file
//! The two inference runners, bucket runners with settings read off a configuration:
//!
//! - `inference_runner<Config>`: the language model's forward under the config's inference scope
//!   (`inference::per_layer`: per-layer graphs of the config's modules, captured lazily after
//!   the warmup; `inference::per_block`: the whole forward as one graph), in the batch-size
//!   buckets of `buckets<...>` or `megatron_buckets<...>`.
//! - `vision_runner<Config>`: the vision encoder, from the config's `vision<...>` part only (its
//!   own impl and modules, the V rules; never the language model's), padded to the smallest of
//!   `length_buckets<...>`, or to `max_seq_length<N>`. Its graphs are captured ahead of time
//!   (vision impl `transformer_engine`), or none (vision impl `none`).

#include <capscope/plan/inference_settings.hpp>
#include <capscope/run/bucket_runner.hpp>

namespace capscope {

// `::checked` instantiates the settings where the runner type is named, not first where a runner
// is built: a config without buckets fails (P5) at `using server = inference_runner<cfg>;`.
template <class Config>
using inference_runner = bucket_runner<typename inference_settings<Config>::checked>;

template <class Config>
using vision_runner = bucket_runner<typename vision_inference_settings<Config>::checked>;

} // namespace capscope
