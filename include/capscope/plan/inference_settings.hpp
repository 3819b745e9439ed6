#pragma once
//! @file
//! What an inference runner reads off a configuration (pure host, checked at compile time):
//! `inference_settings<Config>` for the language model (its inference scope, modules and batch
//! buckets), `vision_inference_settings<Config>` for the vision encoder (the `vision<...>` part
//! only, never the language model's settings, and its length buckets). Rule P5: a runner needs
//! its buckets.

#include <capscope/config/config.hpp>
#include <capscope/config/inference_options.hpp>

namespace capscope {

//! What a bucket runner reads off a configuration.
struct bucket_runner_settings {
    inference_scope scope = inference_scope::eager;
    region_set modules; //!< the regions captured per layer; none = whole layers
    bucket_list sizes;
    int warmup_runs = 0;     //!< eager forwards per bucket before its graphs are captured
    bool ahead_of_time = false;
    oversize on_oversize = oversize::raise;
    bucket_exec execs = bucket_exec::per_bucket;
    capture_mode mode = capture_mode::per_thread;
    capture_failure on_failure = capture_failure::raise;
};

//! The language model's inference runner settings (`inference_runner<Config>`).
template <class Config>
struct inference_settings {
    static_assert(!Config::engine.batch_buckets.empty(),
                  "capscope plan rule P5: an inference runner needs its batch-size buckets -- fix: add buckets<1, 2, 4, 8, ...> "
                  "or megatron_buckets<num_cuda_graphs, max_tokens> to the config");
    static constexpr bucket_runner_settings value{Config::inference,
                                                  Config::regions,
                                                  Config::engine.batch_buckets,
                                                  Config::warmup_steps,
                                                  false,
                                                  Config::engine.on_oversize,
                                                  Config::engine.execs,
                                                  Config::engine.mode,
                                                  Config::engine.on_failure};
    //! Naming this member instantiates the class, so rule P5 fires where a runner type is named.
    using checked = inference_settings;
};

namespace detail {
template <class Config>
constexpr bucket_list vision_lengths() {
    constexpr vision_settings v = Config::normalized.vision;
    if constexpr (!Config::engine.length_buckets.empty()) return Config::engine.length_buckets;
    else return bucket_list{v.max_seq_length.value_or(0)};
}

} // namespace detail

//! The vision encoder's runner settings (`vision_runner<Config>`): its graphs are captured ahead
//! of time (vision impl `transformer_engine`) or not at all (`none`).
template <class Config>
struct vision_inference_settings {
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
                                                  detail::vision_lengths<Config>(),
                                                  Config::warmup_steps,
                                                  true,
                                                  oversize::raise,
                                                  Config::engine.execs,
                                                  Config::engine.mode,
                                                  Config::engine.on_failure};
    using checked = vision_inference_settings; //!< see inference_settings::checked
};

} // namespace capscope
