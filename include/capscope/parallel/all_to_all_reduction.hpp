#pragma once
//! @file
//! An all-reduce whose bytes all move on copy engines: each rank sends part r of its tensor to
//! rank r (`ncclAlltoAll`, into a scratch window), sums the parts it received with cuBLAS
//! (`geam`; for `ncclAvg` each part scaled by 1/ranks first, as NCCL's pre-multiplied sum does),
//! and an in-place `ncclAllGather` brings every rank's summed part to all. With the tensors and
//! the scratch in NCCL symmetric windows (nccl_window.hpp) on a communicator with
//! `nccl_cta_policy::zero`, NCCL 2.28 runs both collectives as copy-engine copies within a node.
//! What is left on SMs is the sum, which reads each received byte once at memory speed, where
//! NCCL's reduce-scatter kernel holds its SMs for as long as the bytes take to cross NVLink.
//!
//! On two ranks it gives the bits of `ncclAllReduce` (a sum of two terms has one order); past two,
//! it adds the parts in rank order, which NCCL's ring does not. Float32 and float64, sum or
//! average. The scratch holds one layer's tensors: `largest_layer_bytes`, made once (registering a
//! window is collective, and no capture may do it).

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/cuda/nccl_window.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/parallel/reduction_buckets.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace capscope::detail {

//! Runs `issue(i)` for each tensor i of [first, last) in one NCCL group (no group for one call).
template <class Issue>
void in_one_group(std::size_t first, std::size_t last, Issue&& issue) {
    if (last - first == 1) return issue(first);
    cuda::in_nccl_group([&] {
        for (std::size_t i = first; i < last; ++i) issue(i);
    });
}

//! The all-to-all reduction of one communicator: its scratch window and the cuBLAS handle of
//! the sum. Every rank makes it with the same size (a window registers on every rank).
class all_to_all_sum {
public:
    all_to_all_sum(const cuda::nccl_communicator& comm, ncclDataType_t type, ncclRedOp_t op, std::size_t largest_layer_bytes)
        : comm_(comm.get()), ranks_(comm.size()), rank_(comm.rank()), type_(type), op_(op), blas_(std::size_t(1) << 20),
          scratch_(comm, comm.size() > 1 ? largest_layer_bytes : 0) {
        if (type != ncclFloat32 && type != ncclFloat64)
            throw std::invalid_argument("all_reduce_as::all_to_all_then_all_gather sums with cuBLAS geam, for float32 and float64 only -- fix: "
                                        "all_reduce_as::reduce_scatter_then_all_gather for other types");
        if (op != ncclSum && op != ncclAvg)
            throw std::invalid_argument("all_reduce_as::all_to_all_then_all_gather sums or averages -- fix: ncclSum or ncclAvg, or "
                                        "all_reduce_as::reduce_scatter_then_all_gather for other operations");
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
        throw std::invalid_argument("all_reduce_as::all_to_all_then_all_gather and reduce_scatter_as::all_to_all_then_sum need ncclAlltoAll, "
                                    "NCCL 2.28 or later (this is " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                                    ") -- fix: all_reduce_as::reduce_scatter_then_all_gather / reduce_scatter_as::one_call, or a newer NCCL");
#endif
        if (comm.size() > 1 && largest_layer_bytes == 0)
            throw std::invalid_argument("all_reduce_as::all_to_all_then_all_gather needs a scratch of one layer's gradients -- fix: pass the "
                                        "most bytes one layer's gradients take");
    }
    all_to_all_sum(const all_to_all_sum&) = delete; // it owns a window
    all_to_all_sum& operator=(const all_to_all_sum&) = delete;

    //! All-reduces `tensors` in place, in buckets of up to `bucket_bytes`: one group of
    //! all-to-alls, the sums, then one group of all-gathers (which need the sums).
    void run(std::span<const tensor_ref> tensors, std::size_t bucket_bytes, cudaStream_t s) const {
        if (ranks_ == 1) return; // one rank: its sum and its average are its own tensors
        const std::size_t element = element_bytes(), ranks = std::size_t(ranks_);
        require_whole_elements(tensors, element, "capscope gradient all-reduce (all-to-all)");
        for_each_reduction_bucket(tensors, bucket_bytes, [&](std::size_t first, std::size_t last) {
            auto part_of = [&](std::size_t i) { return tensors[i].bytes / element / ranks; };
            auto at = [&](std::size_t i, std::size_t elements) { return static_cast<char*>(tensors[i].data) + elements * element; };
            std::size_t needed = 0;
            for (std::size_t i = first; i < last; ++i) needed += part_of(i) * ranks * element;
            if (needed > scratch_.bytes())
                throw std::length_error("capscope gradient all-reduce (all-to-all): a bucket of " + std::to_string(needed) +
                                        " bytes does not fit the scratch of " + std::to_string(scratch_.bytes()) +
                                        " -- fix: make the reduction with the most bytes one layer's gradients take");
            // Parts r of every tensor to rank r; a tail past ranks * part is all-reduced by NCCL.
            std::size_t offset = 0;
            in_one_group(first, last, [&](std::size_t i) {
                const std::size_t count = tensors[i].bytes / element, part = part_of(i), split = part * ranks;
                if (part) all_to_all(tensors[i].data, scratch_.data() + offset, part, s);
                if (split < count) CAPSCOPE_CHECK(ncclAllReduce(at(i, split), at(i, split), count - split, type_, op_, comm_, s));
                offset += split * element;
            });
            offset = 0;
            for (std::size_t i = first; i < last && !installed_breakage().skip_all_to_all_sum; ++i) {
                const std::size_t part = part_of(i);
                if (part) sum_parts(at(i, std::size_t(rank_) * part), scratch_.data() + offset, part, s);
                offset += part * ranks * element;
            }
            in_one_group(first, last, [&](std::size_t i) {
                const std::size_t part = part_of(i);
                if (part) CAPSCOPE_CHECK(ncclAllGather(at(i, std::size_t(rank_) * part), tensors[i].data, part, type_, comm_, s));
            });
        });
    }

    //! Reduce-scatters `full` (`ranks` parts of `part` elements, at the same offset of a symmetric
    //! window on every rank) into this rank's `shard`: the all-to-all into the scratch, then the
    //! sum. One rank copies its part.
    void reduce_scatter(const void* full, void* shard, std::size_t part, cudaStream_t s) const {
        const std::size_t element = element_bytes();
        if (ranks_ == 1) {
            if (full != shard) CAPSCOPE_CHECK(cudaMemcpyAsync(shard, full, part * element, cudaMemcpyDeviceToDevice, s));
            return;
        }
        if (part * std::size_t(ranks_) * element > scratch_.bytes())
            throw std::length_error("capscope gradient reduce-scatter (all-to-all): " + std::to_string(part * std::size_t(ranks_) * element) +
                                    " bytes do not fit the scratch of " + std::to_string(scratch_.bytes()) +
                                    " -- fix: make the reduction with the most bytes one layer's full gradients take");
        all_to_all(full, scratch_.data(), part, s);
        if (!installed_breakage().skip_all_to_all_sum) sum_parts(shard, scratch_.data(), part, s);
    }

private:
    std::size_t element_bytes() const { return type_ == ncclFloat64 ? 8 : 4; } // (the constructor takes float32 and float64 only)
    void all_to_all([[maybe_unused]] const void* from, [[maybe_unused]] void* to, [[maybe_unused]] std::size_t part,
                    [[maybe_unused]] cudaStream_t s) const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
        CAPSCOPE_CHECK(ncclAlltoAll(from, to, part, type_, comm_, s));
#endif // (older: the constructor refused)
    }
    //! out = scale * parts[0] + scale * parts[1] (+ scale * parts[r], one rank at a time), as a
    //! matrix of `rows` by count / rows (cuBLAS tiles geam in two dimensions), in slices of at most
    //! INT_MAX columns (geam's sizes are ints).
    void sum_parts(void* out, const std::byte* parts, std::size_t count, cudaStream_t s) const {
        std::size_t rows = 4096;
        while (count % rows) rows /= 2;
        const std::size_t columns = count / rows, most = std::size_t(std::numeric_limits<int>::max());
        const cublasHandle_t h = blas_.on(s);
        const std::size_t element = element_bytes(), bytes = count * element;
        for (std::size_t first = 0; first < columns; first += most) {
            const int m = int(rows), n = int(std::min(most, columns - first));
            const std::size_t at = first * rows * element; // bytes into each part and into out
            auto part = [&](int r) { return parts + std::size_t(r) * bytes + at; };
            std::byte* to = static_cast<std::byte*>(out) + at;
            if (type_ == ncclFloat32) sum_slice<float>(h, m, n, part, reinterpret_cast<float*>(to));
            else sum_slice<double>(h, m, n, part, reinterpret_cast<double*>(to));
        }
    }
    template <class F, class Part>
    void sum_slice(cublasHandle_t h, int m, int n, const Part& part, F* out) const {
        const F scale = op_ == ncclAvg ? F(1) / F(ranks_) : F(1), one = F(1);
        auto geam = [&](const F* alpha, const F* a, const F* beta, const F* b) {
            if constexpr (std::is_same_v<F, float>) CAPSCOPE_CHECK(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, alpha, a, m, beta, b, m, out, m));
            else CAPSCOPE_CHECK(cublasDgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, alpha, a, m, beta, b, m, out, m));
        };
        geam(&scale, reinterpret_cast<const F*>(part(0)), &scale, reinterpret_cast<const F*>(part(1)));
        for (int r = 2; r < ranks_; ++r) geam(&one, out, &scale, reinterpret_cast<const F*>(part(r)));
    }

    ncclComm_t comm_;
    int ranks_, rank_;
    ncclDataType_t type_;
    ncclRedOp_t op_;
    cuda::blas_handle blas_;
    cuda::nccl_symmetric_buffer<std::byte> scratch_;
};

} // namespace capscope::detail
