#include <gpt/parameters.hpp>

#include "kernels.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace gpt {

template <class T>
typename parameter_store<T>::id parameter_store<T>::declare(std::string name, std::size_t count, init_kind init, float stddev) {
    if (!master_.empty()) throw std::logic_error("parameter_store: '" + name + "' declared after allocate()");
    params_.push_back({std::move(name), total_, count, init, stddev});
    total_ += count;
    return params_.size() - 1;
}

template <class T> void parameter_store<T>::allocate(std::uint64_t seed, cudaStream_t s) {
    master_ = capscope::cuda::device_buffer<float>(total_);
    grads_ = capscope::cuda::device_buffer<float>(total_);
    m_ = capscope::cuda::device_buffer<float>(total_);
    v_ = capscope::cuda::device_buffer<float>(total_);
    values_ = capscope::cuda::device_buffer<T>(total_);
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
    master_.copy_from_host(host, s);
    kernels::cast_from_float(master_.data(), values_.data(), long(total_), s);
    m_.fill_bytes(0, s);
    v_.fill_bytes(0, s);
    grads_.fill_bytes(0, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // `host` dies here
}

template class parameter_store<float>;
template class parameter_store<__nv_bfloat16>;

} // namespace gpt
