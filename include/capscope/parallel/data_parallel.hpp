#pragma once
//! @file
//! Data parallelism on hooks: every rank holds all parameters and runs its share of the batch;
//! a backward hook per layer reduces the layer's gradients across the ranks after the layer's
//! backward of the last microbatch (earlier microbatches accumulate locally), one NCCL call per
//! bucket (gradients adjacent in memory, up to a size). The hook is capturable: it is captured
//! into the layer's backward graph (per-layer impls) or the step's graph (whole_iteration), and
//! every rank captures the same calls in the same order (`require_same_plan` checks the plans).
//! The plan also fingerprints the ranks' programs: `plan_fingerprint`.

#include <capscope/cuda/nccl.hpp>
#include <capscope/hooks/hook.hpp>
#include <capscope/plan/print.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace capscope {

namespace detail {
constexpr std::size_t nccl_type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

struct gradient_reduction {
    ncclComm_t comm;
    int last_microbatch;
    std::size_t bucket_bytes;
    ncclDataType_t type;
    ncclRedOp_t op;

    void operator()(backward_context& c) const {
        if (c.microbatch() != last_microbatch) return; // the earlier microbatches accumulate locally
        const auto grads = c.gradients();
        const std::size_t element = nccl_type_bytes(type);
        for (std::size_t i = 0; i < grads.size();) {
            auto* start = static_cast<std::byte*>(grads[i].data);
            std::size_t bytes = grads[i].bytes;
            std::size_t j = i + 1;
            while (j < grads.size() && static_cast<std::byte*>(grads[j].data) == start + bytes && bytes + grads[j].bytes <= bucket_bytes)
                bytes += grads[j++].bytes;
            CAPSCOPE_CHECK(ncclAllReduce(start, start, bytes / element, type, op, comm, c.stream()));
            i = j;
        }
    }
};
} // namespace detail

//! The data-parallel backward hook: reduces (`op`, by default the average) each layer's gradients
//! of type `type` across the ranks of `comm`, after the backward of microbatch `microbatches - 1`.
inline auto gradient_all_reduce(const cuda::nccl_communicator& comm, int microbatches, ncclDataType_t type = ncclFloat32,
                                ncclRedOp_t op = ncclAvg, std::size_t bucket_bytes = std::size_t(40) << 20) {
    if (detail::nccl_type_bytes(type) == 0) throw std::invalid_argument("gradient_all_reduce: unsupported NCCL data type");
    return hook<hook_phase::backward, capturable>(
        "grad all-reduce", detail::gradient_reduction{comm.get(), microbatches - 1, bucket_bytes, type, op});
}

//! A fingerprint of a training plan and its program (segments, graphs, stage names and kinds):
//! equal on ranks that will capture the same collectives in the same order.
inline std::uint64_t plan_fingerprint(const training_plan& plan, const training_program& program) {
    return cuda::fingerprint(to_text(plan, program));
}

} // namespace capscope
