#pragma once
//! @file
//! All parameters of a model in one flat set of arenas, allocated once at set-up: fp32 master
//! weights, the working copy in the model's precision, fp32 gradients and AdamW's two moments.
//! One optimizer launch updates everything. Gradients accumulate: every backward adds to them
//! (gradient accumulation over microbatches), and a step clears them once (`zero_grads`).

#include <capscope/cuda/buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

enum class init_kind { normal, ones };

struct parameter_info {
    std::string name;
    std::size_t offset = 0;
    std::size_t count = 0;
    init_kind init = init_kind::normal;
    float stddev = 0.f;
};

template <class T>
class parameter_store {
public:
    using id = std::size_t;

    //! Declares a parameter; valid until `allocate`.
    id declare(std::string name, std::size_t count, init_kind init, float stddev = 0.f);
    //! Allocates the arenas and draws the initial values from `seed` (host RNG, set-up only).
    //! Without training state only the working copy is kept: no masters, gradients or moments.
    void allocate(std::uint64_t seed, cudaStream_t s, bool training_state = true);
    //! Copies another store's working values (same parameters, same order), e.g. a trained model's.
    void copy_values_from(const parameter_store& other, cudaStream_t s);
    //! Device bytes of the arenas.
    std::size_t device_bytes() const { return master_.bytes() + grads_.bytes() + m_.bytes() + v_.bytes() + values_.bytes(); }

    T* value(id i) const { return values_.data() + params_.at(i).offset; }
    float* grad(id i) const { return grads_.data() + params_.at(i).offset; }
    float* master(id i) const { return master_.data() + params_.at(i).offset; }
    const std::vector<parameter_info>& list() const { return params_; }
    std::size_t total() const { return total_; }

    float* grads() const { return grads_.data(); }
    //! One memset over the whole gradient arena.
    void zero_grads(cudaStream_t s) { grads_.fill_bytes(0, s); }
    T* values() const { return values_.data(); }
    float* masters() const { return master_.data(); }
    float* first_moment() const { return m_.data(); }
    float* second_moment() const { return v_.data(); }

private:
    std::vector<parameter_info> params_;
    std::size_t total_ = 0;
    capscope::cuda::device_buffer<float> master_, grads_, m_, v_;
    capscope::cuda::device_buffer<T> values_;
};

} // namespace gpt
