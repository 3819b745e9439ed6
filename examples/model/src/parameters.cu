#include <gpt/parameters.hpp>

#include "kernels.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace gpt {

template <class T>
typename parameter_store<T>::id parameter_store<T>::declare(std::string name, std::size_t count, init_kind init, float stddev) {
    if (!values_.empty()) throw std::logic_error("parameter_store: '" + name + "' declared after allocate()");
    params_.push_back({std::move(name), total_, count, init, stddev});
    total_ += count;
    return params_.size() - 1;
}

template <class T> void parameter_store<T>::allocate(std::uint64_t seed, cudaStream_t s, bool training_state) {
    // Forward-only: the fp32 draw goes through a temporary buffer, freed when this returns.
    capscope::cuda::device_buffer<float> staging(training_state ? 0 : total_);
    if (training_state) {
        master_ = capscope::cuda::device_buffer<float>(total_);
        grads_ = capscope::cuda::device_buffer<float>(total_);
        m_ = capscope::cuda::device_buffer<float>(total_);
        v_ = capscope::cuda::device_buffer<float>(total_);
    }
    values_ = capscope::cuda::device_buffer<T>(total_);
    capscope::cuda::device_buffer<float>& fp32 = training_state ? master_ : staging;
    std::vector<float> host(total_);
    std::mt19937_64 rng(seed);
    for (const auto& p : params_) {
        if (p.init == init_kind::ones) {
            std::fill_n(host.begin() + std::ptrdiff_t(p.offset), p.count, 1.f);
            continue;
        }
        if (!(p.stddev > 0.f)) throw std::invalid_argument("parameter '" + p.name + "': normal init needs a positive stddev");
        std::normal_distribution<float> normal(0.f, p.stddev);
        for (std::size_t i = 0; i < p.count; ++i) host[p.offset + i] = normal(rng);
    }
    fp32.copy_from_host(host, s);
    kernels::cast_from_float(fp32.data(), values_.data(), long(total_), s);
    if (training_state) {
        m_.fill_bytes(0, s);
        v_.fill_bytes(0, s);
        grads_.fill_bytes(0, s);
    }
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // `host` and `staging` die here
}

template <class T> void parameter_store<T>::copy_values_from(const parameter_store& other, cudaStream_t s) {
    bool same = other.params_.size() == params_.size() && other.total_ == total_;
    for (std::size_t i = 0; same && i < params_.size(); ++i) same = other.params_[i].name == params_[i].name && other.params_[i].count == params_[i].count;
    if (!same || other.values_.empty() || values_.empty())
        throw std::invalid_argument("parameter_store::copy_values_from: the stores do not hold the same allocated parameters "
                                    "(build both models from one model_config)");
    CAPSCOPE_CHECK(cudaMemcpyAsync(values_.data(), other.values_.data(), values_.bytes(), cudaMemcpyDeviceToDevice, s));
}

template class parameter_store<float>;
template class parameter_store<__nv_bfloat16>;

} // namespace gpt
