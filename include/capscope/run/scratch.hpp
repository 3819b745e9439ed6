#pragma once
//! @file
//! Stream-ordered scratch memory for stages, from the runner's one pool, shared by its graphs.
//!
//! A stage asks for temporary device memory with `capscope::scratch_allocate(bytes, stream)`
//! and gives it back with `capscope::scratch_free(p, stream)` before it returns. While a runner
//! runs a segment eagerly, the memory comes from the runner's `cudaMemPool_t` (stream-ordered,
//! cached). While it captures a segment, it comes from the runner's arena: every segment starts
//! at the arena's beginning, because segments run one after another on one stream, so all of a
//! runner's graphs share the same memory. The arena is sized from the warmup steps (the most
//! any one segment needed), and replays allocate nothing.
//!
//! Plain `cudaMallocAsync` inside a captured segment works too, but CUDA then gives each graph
//! memory of its own (graph memory nodes): N graphs keep N times the scratch.
//! Outside any runner, `scratch_allocate` is `cudaMallocAsync`.
//!
//! Stages on a side lane run beside the segments of the step's stream, so they cannot share the
//! arena: `scratch_allocate` there is an error (allocate such a stage's buffers once, at set-up).
//! The pool is created at the first allocation, so a runner whose stages take no scratch makes
//! no CUDA call for it.

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace capscope {

class scratch_pool {
public:
    static constexpr std::size_t alignment = 256;

    scratch_pool() { live_.reserve(64); }

    void* allocate(std::size_t bytes, cudaStream_t s) {
        if (side_lane_)
            throw std::logic_error("capscope scratch: a stage on a side lane asked for scratch memory; side lanes run beside the "
                                   "step's segments and cannot share their arena -- allocate the stage's buffers once, at set-up");
        const std::size_t size = (bytes + alignment - 1) / alignment * alignment;
        if (capturing_) {
            if (top_ + size > arena_.size())
                throw std::length_error("capscope scratch: a captured segment needs more than the " + std::to_string(arena_.size()) +
                                        " bytes of scratch its warmup steps needed; run the segment eagerly at least once first "
                                        "(warmup_steps<N> with N >= 1)");
            void* p = arena_.data() + top_;
            push(p, size);
            return p;
        }
        void* p = nullptr;
        CAPSCOPE_CHECK(cudaMallocFromPoolAsync(&p, size, pool(), s));
        push(p, size);
        return p;
    }

    void free(void* p, cudaStream_t s) {
        std::size_t size = 0;
        for (std::size_t i = live_.size(); i-- > 0;)
            if (live_[i].p == p) {
                size = live_[i].size;
                live_.erase(live_.begin() + std::ptrdiff_t(i));
                break;
            }
        if (size == 0) throw std::invalid_argument("capscope scratch: scratch_free of a pointer scratch_allocate did not return (or freed twice)");
        if (!capturing_) CAPSCOPE_CHECK(cudaFreeAsync(p, s));
        // Space is reused last-in first-out; the rest comes back when the segment ends.
        top_ = 0;
        for (const auto& a : live_) top_ = std::max(top_, a.offset + a.size);
    }

    //! Whether the stage about to run is on a side lane (then it may not take scratch).
    void on_side_lane(bool side) noexcept { side_lane_ = side; }

    //! Brackets one segment's run (eager) or capture.
    void begin_segment(bool capturing) {
        capturing_ = capturing;
        top_ = 0;
        live_.clear();
    }
    void end_segment(std::string_view segment) {
        const bool leaked = !live_.empty();
        capturing_ = false;
        side_lane_ = false;
        live_.clear();
        top_ = 0;
        if (leaked)
            throw std::logic_error("capscope scratch: segment " + std::string(segment) +
                                   " returned with scratch memory it did not free; call scratch_free before the stage returns");
    }
    //! Makes the arena as large as the most scratch one segment has needed so far. A smaller
    //! arena that graphs already point into is kept until `release_retired()`.
    void reserve_arena() {
        if (arena_.size() >= needed_) return;
        if (!arena_.empty()) retired_.push_back(std::move(arena_));
        arena_ = cuda::device_buffer<std::byte>(needed_);
    }
    //! Frees the arenas that only destroyed graphs pointed into.
    void release_retired() noexcept { retired_.clear(); }
    std::size_t arena_bytes() const noexcept { return arena_.size(); }
    std::size_t most_needed() const noexcept { return needed_; }
    //! The stream-ordered pool eager segments take scratch from (created on first use).
    cudaMemPool_t pool() {
        if (!pool_) {
            int device = 0;
            CAPSCOPE_CHECK(cudaGetDevice(&device));
            cudaMemPoolProps props{};
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = device;
            CAPSCOPE_CHECK(cudaMemPoolCreate(pool_.out(), &props));
            std::uint64_t keep = UINT64_MAX; // keep freed memory cached in the pool between steps
            CAPSCOPE_CHECK(cudaMemPoolSetAttribute(pool_.get(), cudaMemPoolAttrReleaseThreshold, &keep));
        }
        return pool_.get();
    }

private:
    struct allocation {
        void* p;
        std::size_t offset, size;
    };
    void push(void* p, std::size_t size) {
        live_.push_back({p, top_, size});
        top_ += size;
        needed_ = std::max(needed_, top_);
    }
    capscope::detail::unique_handle<cudaMemPool_t, &cudaMemPoolDestroy> pool_;
    cuda::device_buffer<std::byte> arena_;
    std::vector<cuda::device_buffer<std::byte>> retired_;
    std::vector<allocation> live_;
    std::size_t top_ = 0, needed_ = 0;
    bool capturing_ = false, side_lane_ = false;
};

namespace detail {
inline thread_local scratch_pool* active_scratch = nullptr;
} // namespace detail

//! Makes `pool` the one `scratch_allocate` uses on this thread while it lives.
class scratch_scope {
public:
    explicit scratch_scope(scratch_pool& pool) noexcept : previous_(detail::active_scratch) { detail::active_scratch = &pool; }
    ~scratch_scope() { detail::active_scratch = previous_; }
    scratch_scope(const scratch_scope&) = delete;
    scratch_scope& operator=(const scratch_scope&) = delete;

private:
    scratch_pool* previous_;
};

//! Temporary device memory for a stage, ordered on `s`; free it with `scratch_free` before the
//! stage returns.
inline void* scratch_allocate(std::size_t bytes, cudaStream_t s) {
    if (detail::active_scratch) return detail::active_scratch->allocate(bytes, s);
    void* p = nullptr;
    CAPSCOPE_CHECK(cudaMallocAsync(&p, bytes, s));
    return p;
}
inline void scratch_free(void* p, cudaStream_t s) {
    if (detail::active_scratch) return detail::active_scratch->free(p, s);
    CAPSCOPE_CHECK(cudaFreeAsync(p, s));
}

} // namespace capscope
