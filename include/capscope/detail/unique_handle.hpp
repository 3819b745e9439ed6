#pragma once
//! @file
//! The move-only ownership every CUDA owner in capscope/cuda/ shares: a handle, released once
//! by `Release` unless moved from. The owners add only their constructors and operations.

#include <utility>

namespace capscope::detail {

template <class Handle, auto Release>
class unique_handle {
public:
    unique_handle() = default;
    explicit unique_handle(Handle h) noexcept : handle_(h) {}
    ~unique_handle() { reset(); }
    unique_handle(unique_handle&& o) noexcept : handle_(std::exchange(o.handle_, Handle{})) {}
    unique_handle& operator=(unique_handle&& o) noexcept {
        if (this != &o) {
            reset();
            handle_ = std::exchange(o.handle_, Handle{});
        }
        return *this;
    }
    unique_handle(const unique_handle&) = delete;
    unique_handle& operator=(const unique_handle&) = delete;

    Handle get() const noexcept { return handle_; }
    //! Where a create call writes the new handle; only on an empty owner.
    Handle* out() noexcept { return &handle_; }
    explicit operator bool() const noexcept { return handle_ != Handle{}; }
    //! Gives the handle up without releasing it (it was released some other way).
    Handle release() noexcept { return std::exchange(handle_, Handle{}); }

private:
    void reset() noexcept {
        if (handle_ != Handle{}) Release(handle_); // release errors cannot be reported from a destructor
        handle_ = Handle{};
    }
    Handle handle_{};
};

} // namespace capscope::detail
