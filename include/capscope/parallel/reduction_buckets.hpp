#pragma once
//! @file
//! How a list of tensors is reduced across ranks: in buckets made from the sizes and the order of
//! the list alone, never from where the tensors lie. Every rank then makes the same NCCL calls in
//! the same order whatever its allocator did, and a bucket of several tensors is one NCCL group
//! (capscope/parallel/data_parallel.hpp), which NCCL runs as one operation. A tensor that is not a
//! whole number of elements is refused, never cut short. Host-only.

#include <capscope/stage/tensor_ref.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace capscope {

//! Throws `std::invalid_argument` naming the first tensor whose size is not a whole number of
//! `element_bytes`-byte elements (a ragged tail would be left out of the reduction).
inline void require_whole_elements(std::span<const tensor_ref> tensors, std::size_t element_bytes, std::string_view who) {
    if (element_bytes == 0) throw std::invalid_argument(std::string(who) + ": elements of 0 bytes");
    for (const tensor_ref& t : tensors)
        if (t.bytes % element_bytes != 0)
            throw std::invalid_argument(std::string(who) + ": tensor '" + t.name + "' has " + std::to_string(t.bytes) + " bytes, not a whole number of " +
                                        std::to_string(element_bytes) + "-byte elements, so its last " + std::to_string(t.bytes % element_bytes) +
                                        " bytes would not be reduced -- fix: give it the reduction's element type, or pad it to whole elements");
}

//! Calls `bucket(first, last)` for each bucket, in order: consecutive tensors [first, last) of the
//! list, as many as fit in `bucket_bytes` (a larger tensor is a bucket of its own). Only sizes
//! decide; nothing is allocated.
template <class Bucket>
void for_each_reduction_bucket(std::span<const tensor_ref> tensors, std::size_t bucket_bytes, Bucket&& bucket) {
    for (std::size_t i = 0; i < tensors.size();) {
        std::size_t bytes = tensors[i].bytes, j = i + 1;
        while (j < tensors.size() && bytes + tensors[j].bytes <= bucket_bytes) bytes += tensors[j++].bytes;
        bucket(i, j);
        i = j;
    }
}

} // namespace capscope
