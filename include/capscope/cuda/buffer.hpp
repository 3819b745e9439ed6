#pragma once
//! @file
//! Move-only owners of device memory and of pinned (page-locked) host memory. All device
//! allocation in capscope and its examples goes through `device_buffer`.

#include <capscope/cuda/error.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace capscope::cuda {

template <class T>
class device_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "device_buffer holds trivially copyable elements");

public:
    device_buffer() = default;
    explicit device_buffer(std::size_t count) : size_(count) {
        if (count) CAPSCOPE_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    }
    ~device_buffer() { release(); }
    device_buffer(device_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;

    T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    std::size_t bytes() const noexcept { return size_ * sizeof(T); }
    bool empty() const noexcept { return size_ == 0; }

    void copy_from_host(std::span<const T> src, cudaStream_t s) {
        require_fits(src.size(), "copy_from_host");
        if (!src.empty()) CAPSCOPE_CHECK(cudaMemcpyAsync(data_, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s));
    }
    void copy_to_host(std::span<T> dst, cudaStream_t s) const {
        require_fits(dst.size(), "copy_to_host");
        if (!dst.empty()) CAPSCOPE_CHECK(cudaMemcpyAsync(dst.data(), data_, dst.size_bytes(), cudaMemcpyDeviceToHost, s));
    }
    void fill_bytes(int byte, cudaStream_t s) {
        if (size_) CAPSCOPE_CHECK(cudaMemsetAsync(data_, byte, bytes(), s));
    }

private:
    void require_fits(std::size_t n, const char* what) const {
        if (n > size_)
            throw std::length_error(std::string("device_buffer::") + what + ": " + std::to_string(n) +
                                    " elements do not fit in a buffer of " + std::to_string(size_));
    }
    void release() noexcept {
        if (data_) cudaFree(data_);
        data_ = nullptr;
        size_ = 0;
    }
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

//! Page-locked host memory: the only kind an asynchronous copy can overlap with compute, and
//! the kind a captured graph's memcpy nodes need.
template <class T>
class pinned_buffer {
    static_assert(std::is_trivially_copyable_v<T>, "pinned_buffer holds trivially copyable elements");

public:
    pinned_buffer() = default;
    explicit pinned_buffer(std::size_t count) : size_(count) {
        if (count) CAPSCOPE_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    }
    ~pinned_buffer() { release(); }
    pinned_buffer(pinned_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    pinned_buffer& operator=(pinned_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;

    T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    std::size_t bytes() const noexcept { return size_ * sizeof(T); }
    std::span<T> span() const noexcept { return {data_, size_}; }
    T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    void release() noexcept {
        if (data_) cudaFreeHost(data_);
        data_ = nullptr;
        size_ = 0;
    }
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace capscope::cuda
