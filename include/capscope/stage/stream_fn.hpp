#pragma once
//! @file
//! `stream_fn`: the one callable type of the stage seam, `void(cudaStream_t)`: no allocation, no
//! virtual call. It binds a member function or a function to an object the trainer keeps alive
//! (`of`, `of_function`), or holds a small callable itself (`from`: a lambda capturing a few
//! pointers and values, copied into the stream_fn, so the trainer need not keep one object per
//! stage and bucket alive). Host-only: the stream is CUDA's
//! `cudaStream_t` (`CUstream_st*`) declared without the CUDA headers, so the plan layer builds
//! and tests without CUDA.

#include <array>
#include <cstddef>
#include <cstring>
#include <type_traits>

struct CUstream_st; // CUDA's opaque stream type; cudaStream_t is CUstream_st*

namespace capscope {

//! A CUDA stream handle, identical to `cudaStream_t`.
using stream_handle = CUstream_st*;

//! A non-owning callable `void(stream_handle)`. The callee must outlive it.
class stream_fn {
public:
    stream_fn() = default;

    //! Binds a member function: `stream_fn::of<&block::forward>(this)`.
    template <auto Method, class C>
    static stream_fn of(C* object) noexcept {
        stream_fn f;
        f.object_ = object;
        f.call_ = [](void* o, stream_handle s) { (static_cast<C*>(o)->*Method)(s); };
        return f;
    }
    //! Binds a free function taking a context pointer: `stream_fn::of<&launch_scratch>(&ctx)`.
    template <auto Function, class C>
        requires requires(C* c, stream_handle s) { Function(c, s); }
    static stream_fn of_function(C* context) noexcept {
        stream_fn f;
        f.object_ = context;
        f.call_ = [](void* o, stream_handle s) { Function(static_cast<C*>(o), s); };
        return f;
    }

    //! Bytes a callable held by `from` may take.
    static constexpr std::size_t inline_bytes = 32;
    //! Holds `f` itself: `stream_fn::from([x = buf.data(), n](cudaStream_t s) { fill(x, n, s); })`.
    //! The callable is trivially copyable (pointers and values, no owning members) and small, so it
    //! is copied with the stage, never allocated.
    template <class F>
        requires(std::is_trivially_copyable_v<F> && sizeof(F) <= inline_bytes && alignof(F) <= alignof(std::max_align_t) &&
                 std::is_invocable_v<const F&, stream_handle>)
    static stream_fn from(F f) noexcept {
        stream_fn r;
        std::memcpy(r.inline_.data(), &f, sizeof f);
        r.call_ = [](void* storage, stream_handle s) { (*static_cast<const F*>(storage))(s); };
        return r;
    }

    void operator()(stream_handle s) const { call_(object_ ? object_ : const_cast<std::byte*>(inline_.data()), s); }
    explicit operator bool() const noexcept { return call_ != nullptr; }

    //! Same object (or the same held bytes) and same function: two stages bound this way do the same work.
    friend bool operator==(const stream_fn&, const stream_fn&) = default;

private:
    void* object_ = nullptr;
    void (*call_)(void*, stream_handle) = nullptr;
    alignas(std::max_align_t) std::array<std::byte, inline_bytes> inline_{}; //!< the callable held by `from`
};

//! A non-owning callable `void(stream_handle, int rows)`: work sized at run time (an inference
//! forward at any batch size up to the model's capacity, run eagerly).
class sized_stream_fn {
public:
    sized_stream_fn() = default;

    //! Binds a member function `void C::f(stream_handle, int)`.
    template <auto Method, class C>
    static sized_stream_fn of(C* object) noexcept {
        sized_stream_fn f;
        f.object_ = object;
        f.call_ = [](void* o, stream_handle s, int rows) { (static_cast<C*>(o)->*Method)(s, rows); };
        return f;
    }

    void operator()(stream_handle s, int rows) const { call_(object_, s, rows); }
    explicit operator bool() const noexcept { return call_ != nullptr; }

private:
    void* object_ = nullptr;
    void (*call_)(void*, stream_handle, int) = nullptr;
};

} // namespace capscope
