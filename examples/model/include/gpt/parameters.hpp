#pragma once
//! @file
//! All parameters of a model in flat arenas, allocated once at set-up: fp32 master weights, the
//! working copy in the model's precision, fp32 gradients and AdamW's two moments. One optimizer
//! launch per arena updates everything. Gradients accumulate: every backward adds to them
//! (gradient accumulation over microbatches), and a step clears them once (`zero_grads`).
//!
//! Replicated (`allocate`): one arena holds every parameter. Sharded (`allocate_sharded`, for
//! sharded data parallelism, gpt/data_parallel.hpp): parameters outside the layers (embeddings,
//! final norm, head) stay in a replicated arena; each layer's parameters are one flat group, of
//! which this rank keeps a shard (masters, working copy, moments, reduced gradients), and whose
//! working copy is gathered before use into a static buffer that `value()` points into. The layer
//! code is the same in both: it asks `value(id)` and `grad(id)`.

#include <capscope/cuda/buffer.hpp>
#include <capscope/parallel/sharding.hpp>
#include <capscope/stage/tensor_ref.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

enum class init_kind { normal, ones };

struct parameter_info {
    std::string name;
    std::size_t offset = 0; //!< in the flat (replicated) order of all parameters
    std::size_t count = 0;
    init_kind init = init_kind::normal;
    float stddev = 0.f;
    int layer = -1;             //!< -1: outside the layers
    std::size_t in_group = 0;   //!< sharded: offset in its layer's group, or in the replicated arena
};

//! How a sharded store splits over the data-parallel ranks.
struct store_sharding {
    int rank = 0;
    int ranks = 1;
    //! Where a layer's gathered working copy lives: two buffers alternating by layer (layer l in
    //! l % 2; needs a gather again before the backward), or one buffer per layer (kept from the
    //! forward for the backward). Both are static: graphs replay on fixed addresses.
    enum class gathered { double_buffer, one_per_layer } gather_into = gathered::double_buffer;
};

//! Where the buffers that collectives read and write come from: replicated, the gradient arena
//! (all-reduced); sharded, the shard of the working copy, the gathered copy, the layers' full
//! gradients and their reduced shard. Empty: cudaMalloc. Given, it returns `bytes` of device
//! memory, freed when the last copy of the pointer goes; gpt/data_parallel.hpp gives NCCL's
//! symmetric windows, in which all-gathers can run on copy engines. Every rank asks for the same
//! sizes in the same order.
using collective_memory_source = std::function<std::shared_ptr<void>(std::size_t bytes)>;

namespace detail {
//! `count` elements of T from cudaMalloc, or from a `collective_memory_source`.
template <class T>
class collective_buffer {
public:
    collective_buffer() = default;
    collective_buffer(std::size_t count, const collective_memory_source& from) : count_(count) {
        if (!from) own_ = capscope::cuda::device_buffer<T>(count);
        else if (count && !(given_ = from(count * sizeof(T))))
            throw std::runtime_error("parameter_store: the collective memory source gave no memory for " + std::to_string(count * sizeof(T)) + " bytes");
    }
    T* data() const { return given_ ? static_cast<T*>(given_.get()) : own_.data(); }
    std::size_t size() const { return count_; }
    std::size_t bytes() const { return count_ * sizeof(T); }
    bool empty() const { return count_ == 0; }
    void fill_bytes(int byte, cudaStream_t s) {
        if (count_) CAPSCOPE_CHECK(cudaMemsetAsync(data(), byte, bytes(), s));
    }

private:
    capscope::cuda::device_buffer<T> own_;
    std::shared_ptr<void> given_;
    std::size_t count_ = 0;
};
} // namespace detail

//! A run of parameters the optimizer steps element by element.
template <class T>
struct optimizer_arena {
    float* master;
    T* value;
    const float* grad;
    float* first_moment;
    float* second_moment;
    std::size_t count;
};

//! Layer `layer`'s group under sharding: this rank's shard of it (`shard` elements, in the
//! arenas of optimizer_arenas()[1]) and the full buffers its forward and backward use.
template <class T>
struct layer_shard {
    T* value_shard;
    T* value_full;       //!< where the gathered working copy lands (static)
    float* grad_full;    //!< the layer's gradients, accumulated over microbatches
    float* grad_shard;   //!< this rank's reduced part of them
    std::size_t shard;   //!< elements per rank (the group padded to ranks * shard)
};

template <class T>
class parameter_store {
public:
    using id = std::size_t;

    //! Declares a parameter; valid until `allocate`. It belongs to the layer set by `begin_layer`.
    id declare(std::string name, std::size_t count, init_kind init, float stddev = 0.f);
    //! The layer that the next declarations belong to (-1: outside the layers). A layer's
    //! parameters are declared together.
    void begin_layer(int layer) { layer_ = layer; }
    //! Allocates the arenas and draws the initial values from `seed` (host RNG, set-up only).
    //! Without training state only the working copy is kept: no masters, gradients or moments.
    void allocate(std::uint64_t seed, cudaStream_t s, bool training_state = true, const collective_memory_source& collective_memory = nullptr);
    //! Allocates this rank's shards and the static gather buffers (see the file comment); the
    //! initial values are the replicated store's, so every layout starts from the same weights.
    void allocate_sharded(std::uint64_t seed, cudaStream_t s, const store_sharding& sharding,
                          const collective_memory_source& collective_memory = nullptr);
    //! Copies another store's working values (same parameters, same order), e.g. a trained model's.
    void copy_values_from(const parameter_store& other, cudaStream_t s);
    //! Device bytes of the arenas (and, sharded, of the gather buffers).
    std::size_t device_bytes() const;

    T* value(id i) const;
    float* grad(id i) const;
    float* master(id i) const; //!< throws for a sharded layer's parameter (this rank keeps a shard)
    const std::vector<parameter_info>& list() const { return params_; }
    std::size_t total() const { return total_; } //!< the model's parameter count

    //! The replicated arena: every parameter, or (sharded) those outside the layers.
    float* grads() const { return grads_.data(); }
    T* values() const { return values_.data(); }
    float* masters() const { return master_.data(); }
    float* first_moment() const { return m_.data(); }
    float* second_moment() const { return v_.data(); }

    //! One memset per gradient arena.
    void zero_grads(cudaStream_t s);
    //! Every gradient arena (what `zero_grads` clears and the optimizer reads).
    std::vector<capscope::tensor_ref> gradient_arenas() const;
    //! The replicated arena, then (sharded) this rank's shard of the layers.
    std::vector<optimizer_arena<T>> optimizer_arenas() const;

    bool sharded() const { return layout_.has_value(); }
    //! Sharded: where each layer's group lies in the shards (layer l is `parameters[l]`); else null.
    const capscope::shard_layout* layout() const { return layout_ ? &*layout_ : nullptr; }
    int rank() const { return sharding_.rank; }
    int layers() const { return layers_; }
    //! Replicated: layer `layer`'s gradients (one run of the flat arena). Sharded: its full gradients.
    capscope::tensor_ref layer_gradients(int layer) const;
    //! Replicated: layer `layer`'s working values (one run of the flat arena); throws for a sharded store.
    capscope::tensor_ref layer_values(int layer) const;
    //! The gradients outside the layers (embeddings, final norm, head): one run per contiguous range.
    std::vector<capscope::tensor_ref> gradients_outside_layers() const;
    layer_shard<T> shard_of(int layer) const; //!< sharded stores only

private:
    std::vector<float> initial_values(std::uint64_t seed) const;
    std::size_t group_begin(int layer) const; //!< flat offset of the layer's first parameter

    std::vector<parameter_info> params_;
    std::size_t total_ = 0;
    int layer_ = -1, layers_ = 0;
    capscope::cuda::device_buffer<float> master_, m_, v_;
    detail::collective_buffer<float> grads_; //!< replicated, what the all-reduce reads and writes
    capscope::cuda::device_buffer<T> values_;
    // Sharded only.
    std::optional<capscope::shard_layout> layout_;
    store_sharding sharding_;
    std::size_t slot_elements_ = 0; //!< a double-buffer slot: the largest padded group
    capscope::cuda::device_buffer<float> shard_master_, shard_m_, shard_v_;
    detail::collective_buffer<float> shard_grad_, grad_full_; //!< what the reduce-scatter reads and writes
    detail::collective_buffer<T> shard_values_, gathered_;    //!< what the all-gathers read and write
};

} // namespace gpt
