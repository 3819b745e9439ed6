#pragma once
//! @file
//! Move-only owners of device memory and of pinned (page-locked) host memory. All device
//! allocation in capscope and its examples goes through `device_buffer`.

#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace capscope::cuda {
namespace detail {

//! `count` elements of T at an address released by `Release`; moved-from arrays are empty.
template <class T, auto Release>
class owned_array {
    static_assert(std::is_trivially_copyable_v<T>, "CUDA buffers hold trivially copyable elements");

public:
    owned_array() = default;
    owned_array(T* adopted, std::size_t count) noexcept : memory_(adopted), size_(count) {}
    owned_array(owned_array&& o) noexcept : memory_(std::move(o.memory_)), size_(std::exchange(o.size_, 0)) {}
    owned_array& operator=(owned_array&& o) noexcept {
        if (this != &o) {
            memory_ = std::move(o.memory_);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }

    T* data() const noexcept { return memory_.get(); }
    std::size_t size() const noexcept { return size_; }
    std::size_t bytes() const noexcept { return size_ * sizeof(T); }
    bool empty() const noexcept { return size_ == 0; }

private:
    capscope::detail::unique_handle<T*, Release> memory_;
    std::size_t size_ = 0;
};

} // namespace detail

template <class T>
class device_buffer : public detail::owned_array<T, &cudaFree> {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t count) : detail::owned_array<T, &cudaFree>(allocate(count), count) {}

    void copy_from_host(std::span<const T> src, cudaStream_t s) {
        require_fits(src.size(), "copy_from_host");
        if (!src.empty()) CAPSCOPE_CHECK(cudaMemcpyAsync(this->data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s));
    }
    void copy_to_host(std::span<T> dst, cudaStream_t s) const {
        require_fits(dst.size(), "copy_to_host");
        if (!dst.empty()) CAPSCOPE_CHECK(cudaMemcpyAsync(dst.data(), this->data(), dst.size_bytes(), cudaMemcpyDeviceToHost, s));
    }
    void fill_bytes(int byte, cudaStream_t s) {
        if (!this->empty()) CAPSCOPE_CHECK(cudaMemsetAsync(this->data(), byte, this->bytes(), s));
    }

private:
    static T* allocate(std::size_t count) {
        T* p = nullptr;
        if (count) CAPSCOPE_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)));
        return p;
    }
    void require_fits(std::size_t n, const char* what) const {
        if (n > this->size())
            throw std::length_error(std::string("device_buffer::") + what + ": " + std::to_string(n) +
                                    " elements do not fit in a buffer of " + std::to_string(this->size()));
    }
};

//! Page-locked host memory: the only kind an asynchronous copy can overlap with compute, and
//! the kind a captured graph's memcpy nodes need.
template <class T>
class pinned_buffer : public detail::owned_array<T, &cudaFreeHost> {
public:
    pinned_buffer() = default;
    explicit pinned_buffer(std::size_t count) : detail::owned_array<T, &cudaFreeHost>(allocate(count), count) {}

    std::span<T> span() const noexcept { return {this->data(), this->size()}; }
    T& operator[](std::size_t i) const noexcept { return this->data()[i]; }

private:
    static T* allocate(std::size_t count) {
        T* p = nullptr;
        if (count) CAPSCOPE_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), count * sizeof(T)));
        return p;
    }
};

} // namespace capscope::cuda
