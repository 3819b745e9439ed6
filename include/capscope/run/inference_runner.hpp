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

#include <capscope/config/config.hpp>
#include <capscope/config/inference_options.hpp>
#include <capscope/run/bucket_runner.hpp>

namespace capscope {

namespace detail {

template <class Config>
struct language_model_inference {
    static_assert(!Config::engine.batch_buckets.empty(),
                  "capscope plan rule P5: an inference runner needs its batch-size buckets -- fix: add buckets<1, 2, 4, 8, ...> "
                  "or megatron_buckets<num_cuda_graphs, max_tokens> to the config");
    static constexpr bucket_runner_settings value{Config::inference,
                                                  Config::modules,
                                                  Config::engine.batch_buckets,
                                                  Config::warmup_steps,
                                                  false,
                                                  Config::engine.on_oversize,
                                                  Config::engine.execs,
                                                  Config::engine.mode,
                                                  Config::engine.on_failure};
};

template <class Config>
constexpr bucket_list vision_lengths() {
    constexpr vision_settings v = Config::normalized.vision;
    if constexpr (!Config::engine.length_buckets.empty()) return Config::engine.length_buckets;
    else return bucket_list{v.max_seq_length.value_or(0)};
}

template <class Config>
struct vision_encoder_inference {
    static constexpr vision_settings vision = Config::normalized.vision;
    static_assert(!Config::engine.length_buckets.empty() || vision.max_seq_length.value_or(0) > 0,
                  "capscope plan rule P5: a vision runner needs the length it pads to -- fix: give vision<...> max_seq_length<N>, "
                  "or add length_buckets<...> to the config");
    static_assert(Config::engine.length_buckets.empty() || vision.max_seq_length.value_or(0) <= 0 ||
                      Config::engine.length_buckets.largest() <= *vision.max_seq_length,
                  "capscope plan rule P5: the largest length bucket is longer than the vision max_seq_length -- fix: make "
                  "max_seq_length<N> at least the largest of length_buckets<...>, or drop a bucket");
    static constexpr bool captures = vision.impl == graph_impl::ahead_of_time_per_layer;
    static constexpr bucket_runner_settings value{captures ? inference_scope::per_layer : inference_scope::eager,
                                                  vision.modules,
                                                  vision_lengths<Config>(),
                                                  Config::warmup_steps,
                                                  true,
                                                  oversize::raise,
                                                  Config::engine.execs,
                                                  Config::engine.mode,
                                                  Config::engine.on_failure};
};

} // namespace detail

template <class Config>
using inference_runner = bucket_runner<detail::language_model_inference<Config>>;

template <class Config>
using vision_runner = bucket_runner<detail::vision_encoder_inference<Config>>;

} // namespace capscope
