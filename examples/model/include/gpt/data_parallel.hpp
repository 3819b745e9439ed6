#pragma once
//! @file
//! The example model on several GPUs, one process per GPU, the parallelism chosen by type:
//!
//!     gpt::data_parallel_trainer<T, Config, gpt::replicated>            // every rank holds every parameter
//!     gpt::data_parallel_trainer<T, Config, capscope::sharded<>>        // every rank a shard of each layer
//!
//! Replicated: a backward hook per layer all-reduces the layer's gradients in the last microbatch
//! (capscope/parallel/data_parallel.hpp). Sharded: the store keeps this rank's shard of each layer
//! (gpt/parameters.hpp); a forward-pre hook all-gathers the layer into a static buffer, a
//! backward-pre hook gathers it again (`regather_for_backward`, into a double buffer) or the
//! forward's copy is kept (`keep_for_backward`, one buffer per layer), and a backward hook
//! reduce-scatters the layer's gradients into the shard (capscope/parallel/sharded.hpp). Both
//! reduce the gradients outside the layers (embeddings, final norm, head) once per step, before
//! the optimizer. One model, one layer code: only the store's layout and the hooks differ.

#include <gpt/model.hpp>

#include <capscope/cuda/nccl.hpp>
#include <capscope/cuda/nccl_window.hpp>
#include <capscope/parallel/nccl_watchdog.hpp>
#include <capscope/hooks.hpp>
#include <capscope/parallel/data_parallel.hpp>
#include <capscope/parallel/sharded.hpp>
#include <capscope/parallel/sharding.hpp>
#include <capscope/run/runner.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpt {

//! Data parallelism with every parameter on every rank.
struct replicated {};

//! Where a trainer's collectives read and write.
enum class collective_buffers {
    device, //!< cudaMalloc
    //! NCCL's symmetric windows on the trainer's communicator (capscope/cuda/nccl_window.hpp).
    //! On a communicator made with `nccl_cta_policy::zero`, all-gathers then run on copy engines
    //! and take no SM from the layers computing beside them: sharded, the parameter gathers;
    //! replicated, each layer's all-reduce is issued as a reduce-scatter and an all-gather
    //! (`capscope::all_reduce_as`), so half of it moves that way.
    nccl_symmetric,
    //! As `nccl_symmetric`, and each layer's gradient reduction is an all-to-all and a sum on this
    //! rank (replicated: then an all-gather, `capscope::all_reduce_as::all_to_all_then_all_gather`;
    //! sharded: the reduce-scatter, `capscope::reduce_scatter_as::all_to_all_then_sum`): every
    //! byte moves on copy engines, and only the sum takes SMs, for a scratch window of one layer's
    //! gradients.
    nccl_symmetric_all_to_all,
};

//! The name, as the ranks' plans and the errors give it.
constexpr const char* name_of(collective_buffers b) {
    return b == collective_buffers::device ? "device" : b == collective_buffers::nccl_symmetric ? "nccl_symmetric" : "nccl_symmetric_all_to_all";
}

namespace detail {
template <class Mode>
inline constexpr bool is_sharded = false;
template <class G, class P, class B, class W>
inline constexpr bool is_sharded<capscope::sharded<G, P, B, W>> = true;

//! Sharded modes: F1/F2 against the config, and the static gather buffers this model implements.
template <class Config, class Mode>
constexpr bool mode_fits() {
    if constexpr (is_sharded<Mode>) {
        static_assert(capscope::sharding_fits<Config, Mode>);
        static_assert(std::is_same_v<typename Mode::gather_into, capscope::static_double_buffer>,
                      "gpt::data_parallel_trainer gathers into static buffers (a double buffer, or one per layer with "
                      "keep_for_backward) -- fix: use capscope::sharded<capscope::static_double_buffer, ...>");
    }
    return true;
}

template <class T>
constexpr ncclDataType_t nccl_type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
    return std::is_same_v<T, float> ? ncclFloat32 : std::is_same_v<T, __half> ? ncclFloat16 : ncclBfloat16;
}

template <class Mode>
auto data_parallel_hooks(const capscope::cuda::nccl_communicator& comm, std::span<const capscope::sharded_layer_buffers> layers,
                         collective_buffers buffers = collective_buffers::device, std::size_t largest_layer_gradient_bytes = 0) {
    using namespace capscope;
    // In symmetric windows, the all-reduce is split so that its all-gather (and, as an all-to-all,
    // its scatter too) can run on copy engines.
    const all_reduce_as as = buffers == collective_buffers::nccl_symmetric              ? all_reduce_as::reduce_scatter_then_all_gather
                             : buffers == collective_buffers::nccl_symmetric_all_to_all ? all_reduce_as::all_to_all_then_all_gather
                                                                                         : all_reduce_as::one_call;
    if constexpr (!is_sharded<Mode>)
        return hook_pipeline{gradient_all_reduce(comm, ncclFloat32, ncclAvg, std::size_t(40) << 20, as, largest_layer_gradient_bytes)};
    else {
        using gather = typename Mode::gather; // prefetched while the layer before computes, or on demand
        const reduce_scatter_as rs = buffers == collective_buffers::nccl_symmetric_all_to_all ? reduce_scatter_as::all_to_all_then_sum : reduce_scatter_as::one_call;
        if constexpr (std::is_same_v<typename Mode::backward, regather_for_backward>)
            return hook_pipeline{parameter_all_gather(comm, layers, gather{}), parameter_regather(comm, layers, gather{}),
                                 gradient_reduce_scatter(comm, layers, ncclAvg, rs)};
        // Kept for backward, each layer's gathered copy has a buffer of its own: one gather a step.
        else return hook_pipeline{parameter_all_gather_once_per_step(comm, layers, gather{}), gradient_reduce_scatter(comm, layers, ncclAvg, rs)};
    }
}

template <class Mode>
std::optional<store_sharding> store_layout(const capscope::cuda::nccl_communicator& comm) {
    if constexpr (!is_sharded<Mode>) return std::nullopt;
    else {
        const bool keep = std::is_same_v<typename Mode::backward, capscope::keep_for_backward>;
        return store_sharding{comm.rank(), comm.size(), keep ? store_sharding::gathered::one_per_layer : store_sharding::gathered::double_buffer};
    }
}

//! Every rank chose the same buffers (registering a window is collective: ranks that differ would
//! wait for each other at the first one, before the plan's check), on a communicator whose policy
//! makes them pay; and, with windows, NCCL's copy-engine state set up now by one small eager
//! all-gather (it is set up at a communicator's first such collective, which a capture forbids).
inline collective_buffers checked_buffers(const capscope::cuda::nccl_communicator& comm, collective_buffers buffers, cudaStream_t s) {
    try {
        capscope::cuda::require_same_plan(comm, capscope::cuda::fingerprint(name_of(buffers)), s);
    } catch (const capscope::cuda::plan_mismatch&) {
        throw std::invalid_argument("gpt::data_parallel_trainer: the ranks chose different collective_buffers (rank " + std::to_string(comm.rank()) +
                                    ": " + name_of(buffers) + ") -- fix: the same on every rank");
    }
    if (buffers == collective_buffers::device) return buffers;
    if (comm.options().cta_policy != capscope::cuda::nccl_cta_policy::zero)
        throw std::invalid_argument(std::string("gpt::data_parallel_trainer: collective_buffers::") + name_of(buffers) +
                                    " moves all-gathers to copy engines only on "
                                    "a communicator with NCCL's zero-CTA policy; on this one they would run NCCL's kernels, and a data-parallel "
                                    "all-reduce would be split for nothing -- fix: make the communicator with "
                                    "cuda::nccl_options{cuda::nccl_cta_policy::zero}, or collective_buffers::device");
    if (comm.size() > 1) {
        capscope::cuda::nccl_symmetric_buffer<float> part(comm, 64), whole(comm, 64 * std::size_t(comm.size()));
        CAPSCOPE_CHECK(ncclAllGather(part.data(), whole.data(), 64, ncclFloat32, comm.get(), s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    }
    return buffers;
}

//! NCCL's symmetric windows on `comm`, or cudaMalloc (an empty source).
inline collective_memory_source collective_memory_of(const capscope::cuda::nccl_communicator& comm, collective_buffers buffers) {
    if (buffers == collective_buffers::device) return nullptr;
    return [&comm](std::size_t bytes) {
        auto b = std::make_shared<capscope::cuda::nccl_symmetric_buffer<std::byte>>(comm, bytes);
        return std::shared_ptr<void>(b, b->data()); // the buffer lives as long as the pointer
    };
}
} // namespace detail

//! Trains `gpt_model<T>` under `Config` on the ranks of `comm` (`Mode`: `replicated` or
//! `capscope::sharded<...>`). Each rank feeds its own batch (`model().set_batch`) and calls
//! `step`; the constructor checks that every rank planned the same step.
template <class T, class Config, class Mode = replicated>
class data_parallel_trainer {
    static constexpr bool is_sharded = detail::is_sharded<Mode>;
    static_assert(is_sharded || std::is_same_v<Mode, replicated>,
                  "gpt::data_parallel_trainer: the mode is gpt::replicated or capscope::sharded<...>");
    static_assert(detail::mode_fits<Config, Mode>());

public:
    using hooks_type = decltype(detail::data_parallel_hooks<Mode>(std::declval<const capscope::cuda::nccl_communicator&>(), {}));
    static_assert(capscope::hooks_fit<Config, hooks_type>);

    //! `watchdog`: how long a step may take before the watchdog ends the process
    //! (capscope/parallel/nccl_watchdog.hpp); it watches every step. `on_fault`, if given, runs
    //! instead of ending the process, after the communicator is aborted. `buffers`: where the
    //! collectives read and write (`collective_buffers`). `comm` must not move while the trainer lives.
    data_parallel_trainer(const model_config& cfg, const capscope::cuda::nccl_communicator& comm, cudaStream_t s,
                          capscope::watchdog_settings watchdog = {}, capscope::step_watchdog::fault_handler on_fault = {},
                          collective_buffers buffers = collective_buffers::device)
        : collective_(detail::checked_buffers(comm, buffers, s)),
          model_(cfg, s, detail::store_layout<Mode>(comm), {}, detail::collective_memory_of(comm, collective_)),
          tensors_(layer_tensors_of(model_.parameters(), comm.size(), param_refs_, grad_refs_, buffers_)),
          hooks_(detail::data_parallel_hooks<Mode>(comm, buffers_, collective_, largest_bytes(grad_refs_))),
          outside_(comm, model_.parameters().gradients_outside_layers()), runner_(program_of(model_, hooks_, tensors_, outside_)),
          watchdog_(comm, watchdog, std::move(on_fault)) {
        capscope::cuda::require_same_plan(comm, capscope::plan_fingerprint(runner_.plan(), runner_.program()), s);
    }
    data_parallel_trainer(const data_parallel_trainer&) = delete; // the program points into it
    data_parallel_trainer& operator=(const data_parallel_trainer&) = delete;

    //! One step, watched (nccl_watchdog::step: the warmup timeout until the graphs replay).
    void step(cudaStream_t s) { watchdog_.step(runner_, s); }
    gpt_model<T>& model() { return model_; }
    const gpt_model<T>& model() const { return model_; }
    capscope::runner<Config>& runner() { return runner_; }
    const capscope::runner<Config>& runner() const { return runner_; }

private:
    static std::size_t largest_bytes(const std::vector<capscope::tensor_ref>& t) {
        std::size_t most = 0;
        for (const auto& r : t) most = std::max(most, r.bytes);
        return most;
    }
    //! What each layer's hooks touch: its gradients, and under sharding the full parameter buffer
    //! the all-gather writes and the layer reads (so the plan orders the layer after the gather).
    static std::vector<capscope::layer_tensors> layer_tensors_of(const parameter_store<T>& p, int ranks, std::vector<capscope::tensor_ref>& params,
                                                                 std::vector<capscope::tensor_ref>& grads,
                                                                 std::vector<capscope::sharded_layer_buffers>& buffers) {
        grads.reserve(std::size_t(p.layers())); // the spans below point into them
        params.reserve(std::size_t(p.layers()));
        std::vector<capscope::layer_tensors> out;
        for (int l = 0; l < p.layers(); ++l) {
            grads.push_back(p.layer_gradients(l));
            std::span<const capscope::tensor_ref> gathered;
            if constexpr (is_sharded) {
                const layer_shard<T> sh = p.shard_of(l);
                buffers.push_back({sh.value_shard, sh.value_full, sh.grad_full, sh.grad_shard, sh.shard, detail::nccl_type_of<T>(), ncclFloat32});
                params.push_back({"layer" + std::to_string(l) + ".parameters (gathered)", sh.value_full, sh.shard * std::size_t(ranks) * sizeof(T)});
                gathered = std::span<const capscope::tensor_ref>(&params.back(), 1);
            }
            out.push_back({gathered, std::span<const capscope::tensor_ref>(&grads.back(), 1)});
        }
        return out;
    }
    static capscope::training_program program_of(const gpt_model<T>& m, const hooks_type& hooks, const std::vector<capscope::layer_tensors>& t,
                                                 capscope::step_gradient_all_reduce& outside) {
        if (m.config().dropless_capacity_factor > 0)
            throw std::invalid_argument("gpt::data_parallel_trainer: a static dropless capacity (model_config::dropless_capacity_factor) "
                                        "reruns a step on the rank whose expert overflowed, and only there, so the ranks' collectives "
                                        "would no longer match -- fix: drop-and-pad MoE, or dropless without a static capacity (moe_router captured)");
        capscope::training_program p = capscope::with_hooks(m.training_program(), hooks, t);
        // Before the optimizer, which waits for the hooks' lane: the reduction is on it too.
        p.step_end.insert(p.step_end.begin(), outside.to_stage());
        return p;
    }

    collective_buffers collective_; //!< checked first: before any window is registered
    gpt_model<T> model_;
    std::vector<capscope::tensor_ref> param_refs_, grad_refs_;
    std::vector<capscope::sharded_layer_buffers> buffers_;
    std::vector<capscope::layer_tensors> tensors_;
    hooks_type hooks_;
    capscope::step_gradient_all_reduce outside_;
    capscope::runner<Config> runner_;
    capscope::cuda::nccl_watchdog watchdog_;
};

} // namespace gpt
