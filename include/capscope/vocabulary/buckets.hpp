#pragma once
//! @file
//! Buckets: the fixed sizes an inference runner captures one graph each for (batch sizes, or the
//! padded lengths of a variable-length encoder), what happens to a request past the largest, and
//! how the buckets' executable graphs are kept. Choosing a bucket is the plan's
//! (`capscope/plan/buckets.hpp`).

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <stdexcept>

namespace capscope {

//! What a runner does with a request larger than its largest bucket.
enum class oversize : unsigned char {
    raise,       //!< throw `bucket_overflow` (the default)
    run_eagerly, //!< run it eagerly at its own size (no padding, no graph)
};

//! An ascending list of positive sizes, as a literal type (a `config<…>` holds one).
struct bucket_list {
    static constexpr std::size_t capacity = 256;
    std::array<int, capacity> sizes{};
    int count = 0;

    constexpr bucket_list() = default;
    constexpr bucket_list(std::initializer_list<int> l) {
        for (int v : l) push_back(v);
    }
    constexpr void push_back(int v) {
        if (count == int(capacity)) throw std::length_error("capscope: at most 256 buckets");
        sizes[std::size_t(count++)] = v;
    }
    constexpr bool empty() const { return count == 0; }
    constexpr int size() const { return count; }
    constexpr int operator[](int i) const { return sizes[std::size_t(i)]; }
    constexpr int largest() const { return count ? sizes[std::size_t(count - 1)] : 0; }
    constexpr std::span<const int> view() const { return {sizes.data(), std::size_t(count)}; }
    //! Positive and strictly increasing, at least one (rule P4).
    constexpr bool well_formed() const {
        if (count == 0) return false;
        for (int i = 0; i < count; ++i)
            if (sizes[std::size_t(i)] < 1 || (i > 0 && sizes[std::size_t(i)] <= sizes[std::size_t(i - 1)])) return false;
        return true;
    }
    friend constexpr bool operator==(const bucket_list& a, const bucket_list& b) {
        if (a.count != b.count) return false;
        for (int i = 0; i < a.count; ++i)
            if (a.sizes[std::size_t(i)] != b.sizes[std::size_t(i)]) return false;
        return true;
    }
};

//! How an inference runner keeps its buckets' executable graphs.
enum class bucket_exec : unsigned char {
    per_bucket, //!< one executable graph per bucket and segment: switching buckets costs nothing
    shared,     //!< one per segment, updated in place (cudaGraphExecUpdate) from the bucket's captured
                //!< graph when the bucket changes: a bucket's count of executable graphs, not all of them
};

} // namespace capscope
