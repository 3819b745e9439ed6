#pragma once
//! @file
//! `stream_fn`: the one callable type of the stage seam, `void(cudaStream_t)`, as a pointer
//! and a function: no allocation, no virtual call. Host-only: the stream is CUDA's
//! `cudaStream_t` (`CUstream_st*`) declared without the CUDA headers, so the plan layer builds
//! and tests without CUDA.

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

    void operator()(stream_handle s) const { call_(object_, s); }
    explicit operator bool() const noexcept { return call_ != nullptr; }

    //! Same object and same function: two stages bound this way do the same work.
    friend bool operator==(const stream_fn&, const stream_fn&) = default;

private:
    void* object_ = nullptr;
    void (*call_)(void*, stream_handle) = nullptr;
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
