#pragma once
//! @file
//! How capscope's runners capture: options Megatron has no flag for, so they live beside the
//! Megatron configuration (`config<…>::engine`) and `select` does not match on them.
//!
//! @code
//! config<impl::lazy_per_layer, modules<capture::attention>, capture_with<capture_mode::global>,
//!        on_capture_failure<capture_failure::run_eagerly>>
//! @endcode

#include <capscope/config/option.hpp>
#include <capscope/vocabulary/buckets.hpp>
#include <capscope/vocabulary/region.hpp>

#include <cstdint>

namespace capscope {

//! The stream-capture mode (`cudaStreamCaptureMode`): which other threads' unsafe CUDA calls
//! (cudaMalloc, synchronizing calls) invalidate a capture in progress.
enum class capture_mode : std::uint8_t {
    global,     //!< any thread's (cudaStreamCaptureModeGlobal)
    per_thread, //!< this thread's only (cudaStreamCaptureModeThreadLocal), the default
    relaxed,    //!< none are checked (cudaStreamCaptureModeRelaxed)
};

//! What a runner does when capturing a segment fails (a stage synchronized, allocated or
//! called an API a capture forbids): the capture is ended and its partial graph destroyed
//! either way, and the stream stays usable.
enum class capture_failure : std::uint8_t {
    raise,       //!< throw `capture_failed`, naming the layer, stage and segment (the default)
    run_eagerly, //!< run that segment eagerly from then on, and count it
};

struct engine_settings {
    capture_mode mode = capture_mode::per_thread;
    //! A trainer's own capture regions, captured beside `modules<...>` (capture_regions<...>).
    region_set regions;
    capture_failure on_failure = capture_failure::raise;
    //! The capture doctor watches the last eager warmup step's CUDA calls (capscope/run/capture_doctor.hpp).
    bool capture_doctor = true;
    // Inference runners (capscope/config/inference_options.hpp):
    bucket_list batch_buckets;  //!< empty: the runner is built without buckets<...>
    bucket_list length_buckets; //!< a variable-length encoder's padded lengths; empty: vision max_seq_length
    oversize on_oversize = oversize::raise;
    bucket_exec execs = bucket_exec::per_bucket;
    friend constexpr bool operator==(const engine_settings&, const engine_settings&) = default;
};

namespace option_kind {
struct capture_mode; struct capture_regions; struct capture_failure; struct batch_buckets; struct length_buckets; struct oversize; struct bucket_exec;
struct capture_doctor;
} // namespace option_kind

//! A type usable as a `config<…>` engine option.
template <class T>
concept engine_option = requires(engine_settings& e) {
    typename T::option_kind;
    T::apply(e);
};

template <capture_mode M>
struct capture_with {
    using option_kind = option_kind::capture_mode;
    static constexpr void apply(engine_settings& e) { e.mode = M; }
};

//! Capture the trainer's own regions (`region<"name">` in its layer schemas, or the names in its
//! stages' `captured_by`), as `modules<...>` captures Megatron's. Naming regions here or in
//! `modules<...>` captures those regions only; naming none captures whole layers.
template <detail::fixed_string... Names>
struct capture_regions {
    static_assert(sizeof...(Names) > 0, "capscope::capture_regions<...> names at least one region; name none to capture whole layers");
    using option_kind = option_kind::capture_regions;
    static constexpr void apply(engine_settings& e) { (e.regions.insert(Names.view()), ...); }
    //! The rule table learns that regions are named: no whole-layer capture (rules OC2, full_cudagraph).
    static constexpr void apply(runtime_config& c) { c.own_capture_regions = true; }
};

template <capture_failure F>
struct on_capture_failure {
    using option_kind = option_kind::capture_failure;
    static constexpr void apply(engine_settings& e) { e.on_failure = F; }
};

//! No capture doctor: the last eager warmup step's CUDA calls are not watched (it needs CUPTI's one
//! subscriber, which a profiler may want; capscope/run/capture_doctor.hpp).
struct capture_doctor_off {
    using option_kind = option_kind::capture_doctor;
    static constexpr void apply(engine_settings& e) { e.capture_doctor = false; }
};

} // namespace capscope
