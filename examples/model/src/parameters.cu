#include <gpt/parameters.hpp>

#include "kernels.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace gpt {

template <class T>
typename parameter_store<T>::id parameter_store<T>::declare(std::string name, std::size_t count, init_kind init, float stddev) {
    if (!values_.empty() || !shard_values_.empty()) throw std::logic_error("parameter_store: '" + name + "' declared after allocate()");
    if (layer_ >= 0 && !params_.empty() && params_.back().layer > layer_)
        throw std::logic_error("parameter_store: '" + name + "' declared for layer " + std::to_string(layer_) + " after layer " +
                               std::to_string(params_.back().layer) + " (declare the layers in order)");
    params_.push_back({std::move(name), total_, count, init, stddev, layer_, 0});
    total_ += count;
    layers_ = std::max(layers_, layer_ + 1);
    return params_.size() - 1;
}

template <class T> std::vector<float> parameter_store<T>::initial_values(std::uint64_t seed) const {
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
    return host;
}

template <class T>
void parameter_store<T>::allocate(std::uint64_t seed, cudaStream_t s, bool training_state, const collective_memory_source& collective_memory) {
    // Forward-only: the fp32 draw goes through a temporary buffer, freed when this returns.
    capscope::cuda::device_buffer<float> staging(training_state ? 0 : total_);
    if (training_state) {
        master_ = capscope::cuda::device_buffer<float>(total_);
        grads_ = detail::collective_buffer<float>(total_, collective_memory);
        m_ = capscope::cuda::device_buffer<float>(total_);
        v_ = capscope::cuda::device_buffer<float>(total_);
    }
    values_ = capscope::cuda::device_buffer<T>(total_);
    capscope::cuda::device_buffer<float>& fp32 = training_state ? master_ : staging;
    const std::vector<float> host = initial_values(seed);
    fp32.copy_from_host(host, s);
    kernels::cast_from_float(fp32.data(), values_.data(), long(total_), s);
    if (training_state) {
        m_.fill_bytes(0, s);
        v_.fill_bytes(0, s);
        grads_.fill_bytes(0, s);
    }
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // `host` and `staging` die here
}

template <class T> std::size_t parameter_store<T>::group_begin(int layer) const {
    for (const auto& p : params_)
        if (p.layer == layer) return p.offset;
    throw std::out_of_range("parameter_store: layer " + std::to_string(layer) + " has no parameters");
}

template <class T>
void parameter_store<T>::allocate_sharded(std::uint64_t seed, cudaStream_t s, const store_sharding& sh, const collective_memory_source& collective_memory) {
    if (sh.ranks < 1 || sh.rank < 0 || sh.rank >= sh.ranks)
        throw std::invalid_argument("allocate_sharded: rank " + std::to_string(sh.rank) + " of " + std::to_string(sh.ranks) +
                                    " ranks; give 0 <= rank < ranks");
    // Each layer's parameters are one group to shard; the rest is replicated.
    std::vector<std::size_t> group(std::size_t(layers_), 0);
    std::size_t replicated = 0;
    for (auto& p : params_) {
        if (p.layer < 0) {
            p.in_group = replicated;
            replicated += p.count;
        } else {
            p.in_group = group[std::size_t(p.layer)];
            group[std::size_t(p.layer)] += p.count;
        }
    }
    layout_ = capscope::make_shard_layout(group, sh.ranks);
    sharding_ = sh;
    const capscope::shard_layout& l = *layout_;
    for (const auto& g : l.parameters) slot_elements_ = std::max(slot_elements_, g.padded);

    master_ = capscope::cuda::device_buffer<float>(replicated);
    grads_ = detail::collective_buffer<float>(replicated, nullptr); // all-reduced once a step, small
    m_ = capscope::cuda::device_buffer<float>(replicated);
    v_ = capscope::cuda::device_buffer<float>(replicated);
    values_ = capscope::cuda::device_buffer<T>(replicated);
    shard_master_ = capscope::cuda::device_buffer<float>(l.shard_elements);
    shard_m_ = capscope::cuda::device_buffer<float>(l.shard_elements);
    shard_v_ = capscope::cuda::device_buffer<float>(l.shard_elements);
    shard_grad_ = detail::collective_buffer<float>(l.shard_elements, collective_memory);
    shard_values_ = detail::collective_buffer<T>(l.shard_elements, collective_memory);
    grad_full_ = detail::collective_buffer<float>(l.full_elements, collective_memory);
    gathered_ = detail::collective_buffer<T>(sh.gather_into == store_sharding::gathered::double_buffer ? 2 * slot_elements_ : l.full_elements,
                                             collective_memory);

    // The same draw as the replicated store, split: the replicated part, and this rank's slice of
    // each layer's group (its padding tail zero, and it stays zero: zero gradient, zero moments).
    const std::vector<float> host = initial_values(seed);
    std::vector<float> host_replicated(replicated), host_shard(l.shard_elements, 0.f);
    for (const auto& p : params_) {
        if (p.layer < 0) {
            std::copy_n(host.begin() + std::ptrdiff_t(p.offset), p.count, host_replicated.begin() + std::ptrdiff_t(p.in_group));
            continue;
        }
        const capscope::sharded_parameter& g = l.parameters[std::size_t(p.layer)];
        const std::size_t first = std::size_t(sh.rank) * g.shard; // this rank's [first, first + shard) of the group
        for (std::size_t i = 0; i < p.count; ++i) {
            const std::size_t at = p.in_group + i;
            if (at >= first && at < first + g.shard) host_shard[g.offset_in_shard + (at - first)] = host[p.offset + i];
        }
    }
    master_.copy_from_host(host_replicated, s);
    shard_master_.copy_from_host(host_shard, s);
    kernels::cast_from_float(master_.data(), values_.data(), long(replicated), s);
    kernels::cast_from_float(shard_master_.data(), shard_values_.data(), long(l.shard_elements), s);
    for (auto* b : {&m_, &v_, &shard_m_, &shard_v_}) b->fill_bytes(0, s);
    grads_.fill_bytes(0, s);
    shard_grad_.fill_bytes(0, s);
    grad_full_.fill_bytes(0, s);
    gathered_.fill_bytes(0, s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s)); // the host vectors die here
}

template <class T> T* parameter_store<T>::value(id i) const {
    const parameter_info& p = params_.at(i);
    if (!layout_) return values_.data() + p.offset;
    if (p.layer < 0) return values_.data() + p.in_group;
    return shard_of(p.layer).value_full + p.in_group;
}

template <class T> float* parameter_store<T>::grad(id i) const {
    const parameter_info& p = params_.at(i);
    if (!layout_) return grads_.data() + p.offset;
    if (p.layer < 0) return grads_.data() + p.in_group;
    return grad_full_.data() + layout_->parameters[std::size_t(p.layer)].offset_in_full + p.in_group;
}

template <class T> float* parameter_store<T>::master(id i) const {
    const parameter_info& p = params_.at(i);
    if (!layout_) return master_.data() + p.offset;
    if (p.layer < 0) return master_.data() + p.in_group;
    throw std::logic_error("parameter_store::master: '" + p.name + "' is sharded; this rank keeps its shard only (optimizer_arenas()[1])");
}

template <class T> layer_shard<T> parameter_store<T>::shard_of(int layer) const {
    if (!layout_) throw std::logic_error("parameter_store::shard_of: the store is replicated (allocate_sharded makes shards)");
    const capscope::sharded_parameter& g = layout_->parameters.at(std::size_t(layer));
    T* full = sharding_.gather_into == store_sharding::gathered::double_buffer ? gathered_.data() + std::size_t(layer % 2) * slot_elements_
                                                                               : gathered_.data() + g.offset_in_full;
    return {shard_values_.data() + g.offset_in_shard, full, grad_full_.data() + g.offset_in_full, shard_grad_.data() + g.offset_in_shard,
            g.shard};
}

template <class T> void parameter_store<T>::zero_grads(cudaStream_t s) {
    grads_.fill_bytes(0, s);
    if (layout_) grad_full_.fill_bytes(0, s); // the shard is written whole by the reduce-scatter
}

template <class T> std::vector<capscope::tensor_ref> parameter_store<T>::gradient_arenas() const {
    std::vector<capscope::tensor_ref> out{{"gradients", grads_.data(), grads_.bytes()}};
    if (layout_) {
        out.push_back({"layer gradients", grad_full_.data(), grad_full_.bytes()});
        out.push_back({"gradient shard", shard_grad_.data(), shard_grad_.bytes()});
    }
    return out;
}

template <class T> std::vector<optimizer_arena<T>> parameter_store<T>::optimizer_arenas() const {
    std::vector<optimizer_arena<T>> out{{master_.data(), values_.data(), grads_.data(), m_.data(), v_.data(), master_.size()}};
    if (layout_)
        out.push_back({shard_master_.data(), shard_values_.data(), shard_grad_.data(), shard_m_.data(), shard_v_.data(), shard_master_.size()});
    return out;
}

template <class T> capscope::tensor_ref parameter_store<T>::layer_gradients(int layer) const {
    const std::string name = "layer" + std::to_string(layer) + ".gradients";
    if (layout_) {
        const capscope::sharded_parameter& g = layout_->parameters.at(std::size_t(layer));
        return {name, grad_full_.data() + g.offset_in_full, g.padded * sizeof(float)};
    }
    std::size_t count = 0;
    for (const auto& p : params_) count += p.layer == layer ? p.count : 0;
    return {name, grads_.data() + group_begin(layer), count * sizeof(float)};
}

template <class T> capscope::tensor_ref parameter_store<T>::layer_values(int layer) const {
    if (layout_)
        throw std::logic_error("parameter_store::layer_values: a sharded store keeps a shard of layer " + std::to_string(layer) +
                               "'s values -- fix: read the gathered copy (shard_of(layer).value_full)");
    std::size_t count = 0;
    for (const auto& p : params_) count += p.layer == layer ? p.count : 0;
    return {"layer" + std::to_string(layer) + ".values", values_.data() + group_begin(layer), count * sizeof(T)};
}

template <class T> std::vector<capscope::tensor_ref> parameter_store<T>::gradients_outside_layers() const {
    if (layout_) return {{"gradients outside the layers", grads_.data(), grads_.bytes()}};
    std::vector<capscope::tensor_ref> out;
    for (const auto& p : params_) {
        if (p.layer >= 0) continue;
        float* at = grads_.data() + p.offset;
        if (!out.empty() && static_cast<std::byte*>(out.back().data) + out.back().bytes == reinterpret_cast<std::byte*>(at))
            out.back().bytes += p.count * sizeof(float);
        else
            out.push_back({"gradients outside the layers", at, p.count * sizeof(float)});
    }
    return out;
}

template <class T> std::size_t parameter_store<T>::device_bytes() const {
    return master_.bytes() + grads_.bytes() + m_.bytes() + v_.bytes() + values_.bytes() + shard_master_.bytes() + shard_grad_.bytes() +
           shard_m_.bytes() + shard_v_.bytes() + shard_values_.bytes() + grad_full_.bytes() + gathered_.bytes();
}

template <class T> void parameter_store<T>::copy_values_from(const parameter_store& other, cudaStream_t s) {
    bool same = other.params_.size() == params_.size() && other.total_ == total_;
    for (std::size_t i = 0; same && i < params_.size(); ++i) same = other.params_[i].name == params_[i].name && other.params_[i].count == params_[i].count;
    if (!same || other.values_.empty() || values_.empty() || other.layout_ || layout_)
        throw std::invalid_argument("parameter_store::copy_values_from: the stores do not hold the same allocated, replicated parameters "
                                    "(build both models from one model_config, without sharding)");
    CAPSCOPE_CHECK(cudaMemcpyAsync(values_.data(), other.values_.data(), values_.bytes(), cudaMemcpyDeviceToDevice, s));
}

template class parameter_store<float>;
template class parameter_store<__nv_bfloat16>;
template class parameter_store<__half>;

} // namespace gpt
