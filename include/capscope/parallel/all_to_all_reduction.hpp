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

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

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
        const std::size_t element = type_ == ncclFloat64 ? 8 : 4, ranks = std::size_t(ranks_);
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
                if (part) CAPSCOPE_CHECK(ncclAlltoAll(tensors[i].data, scratch_.data() + offset, part, type_, comm_, s));
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
        const std::size_t element = type_ == ncclFloat64 ? 8 : 4;
        if (ranks_ == 1) {
            if (full != shard) CAPSCOPE_CHECK(cudaMemcpyAsync(shard, full, part * element, cudaMemcpyDeviceToDevice, s));
            return;
        }
        if (part * std::size_t(ranks_) * element > scratch_.bytes())
            throw std::length_error("capscope gradient reduce-scatter (all-to-all): " + std::to_string(part * std::size_t(ranks_) * element) +
                                    " bytes do not fit the scratch of " + std::to_string(scratch_.bytes()) +
                                    " -- fix: make the reduction with the most bytes one layer's full gradients take");
        CAPSCOPE_CHECK(ncclAlltoAll(full, scratch_.data(), part, type_, comm_, s));
        if (!installed_breakage().skip_all_to_all_sum) sum_parts(shard, scratch_.data(), part, s);
    }

private:
    //! out = scale * parts[0] + scale * parts[1] (+ scale * parts[r], one rank at a time), as a
    //! matrix of `rows` by count / rows: cuBLAS tiles geam in two dimensions.
    void sum_parts(void* out, const std::byte* parts, std::size_t count, cudaStream_t s) const {
        std::size_t rows = 4096;
        while (count % rows) rows /= 2;
        const int m = int(rows), n = int(count / rows);
        const cublasHandle_t h = blas_.on(s);
        const std::size_t element = type_ == ncclFloat64 ? 8 : 4, bytes = count * element;
        if (type_ == ncclFloat32) {
            const float scale = op_ == ncclAvg ? 1.f / float(ranks_) : 1.f, one = 1.f;
            auto part = [&](int r) { return reinterpret_cast<const float*>(parts + std::size_t(r) * bytes); };
            CAPSCOPE_CHECK(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, &scale, part(0), m, &scale, part(1), m, static_cast<float*>(out), m));
            for (int r = 2; r < ranks_; ++r)
                CAPSCOPE_CHECK(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, &one, static_cast<float*>(out), m, &scale, part(r), m,
                                           static_cast<float*>(out), m));
        } else {
            const double scale = op_ == ncclAvg ? 1.0 / double(ranks_) : 1.0, one = 1.0;
            auto part = [&](int r) { return reinterpret_cast<const double*>(parts + std::size_t(r) * bytes); };
            CAPSCOPE_CHECK(cublasDgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, &scale, part(0), m, &scale, part(1), m, static_cast<double*>(out), m));
            for (int r = 2; r < ranks_; ++r)
                CAPSCOPE_CHECK(cublasDgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, &one, static_cast<double*>(out), m, &scale, part(r), m,
                                           static_cast<double*>(out), m));
        }
    }

    ncclComm_t comm_;
    int ranks_, rank_;
    ncclDataType_t type_;
    ncclRedOp_t op_;
    cuda::blas_handle blas_;
    cuda::nccl_symmetric_buffer<std::byte> scratch_;
};

} // namespace capscope::detail
