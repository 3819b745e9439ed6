#pragma once
//! @file
//! Data parallelism on hooks: every rank holds all parameters and runs its share of the batch;
//! a backward hook per layer reduces the layer's gradients across the ranks after the layer's
//! backward of the last microbatch (earlier microbatches accumulate locally), one NCCL call per
//! tensor, grouped in buckets made from the sizes alone (capscope/parallel/reduction_buckets.hpp:
//! the same calls on every rank, whatever its memory layout), on a side stream (lane 1) so that it
//! overlaps the backward of the layers before it. The hook is capturable: under per-layer impls
//! it is a graph of its own per layer, launched on that side stream right after the layer's
//! backward graph; under whole_iteration, a branch of the step's graph; and
//! every rank captures the same calls in the same order (`require_same_plan` checks the plans).
//! The plan also fingerprints the ranks' programs: `plan_fingerprint`.

#include <capscope/cuda/nccl.hpp>
#include <capscope/hooks/hook.hpp>
#include <capscope/parallel/all_to_all_reduction.hpp>
#include <capscope/parallel/reduction_buckets.hpp>
#include <capscope/plan/fingerprint.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace capscope {

//! How a gradient all-reduce is issued.
enum class all_reduce_as {
    one_call, //!< `ncclAllReduce`
    //! `ncclReduceScatter` into this rank's part, then `ncclAllGather` of the parts, both in place
    //! (a tail that does not split evenly is all-reduced). The same bytes move; with the gradients
    //! in NCCL symmetric windows on a communicator with `nccl_cta_policy::zero`
    //! (capscope/cuda/nccl_window.hpp), the all-gather runs on copy engines, so half the work no
    //! longer takes SMs from the backward beside it.
    reduce_scatter_then_all_gather,
    //! `ncclAlltoAll` of the parts into a scratch window, this rank's part summed there by cuBLAS,
    //! then the in-place `ncclAllGather` (capscope/parallel/all_to_all_reduction.hpp): in symmetric
    //! windows with `nccl_cta_policy::zero`, every byte moves on copy engines and only the sum
    //! takes SMs. Float32 and float64, sum or average; a scratch of one layer's gradients.
    all_to_all_then_all_gather,
};

namespace detail {
//! A reduction's bucket size, for the plan's fingerprint: ranks that group their calls
//! differently issue other NCCL groups.
inline std::string bucket_words(std::size_t bucket_bytes) { return "buckets of " + std::to_string(bucket_bytes) + " bytes"; }

constexpr std::size_t nccl_type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

//! All-reduces `gradients` in place: one call per tensor (two, split), a bucket of several
//! tensors (by size, up to `bucket_bytes`) in one NCCL group (split: a group of reduce-scatters,
//! then one of all-gathers, which need the reduced parts). Where the tensors lie changes nothing.
inline void all_reduce_buckets(ncclComm_t comm, std::span<const tensor_ref> gradients, ncclDataType_t type, ncclRedOp_t op,
                               std::size_t bucket_bytes, cudaStream_t s, all_reduce_as as = all_reduce_as::one_call) {
    if (as == all_reduce_as::all_to_all_then_all_gather)
        throw std::logic_error("capscope gradient all-reduce: all_to_all_then_all_gather runs through its scratch (detail::all_to_all_sum)");
    const std::size_t element = nccl_type_bytes(type);
    require_whole_elements(gradients, element, "capscope gradient all-reduce");
    int ranks = 1, rank = 0;
    CAPSCOPE_CHECK(ncclCommCount(comm, &ranks));
    CAPSCOPE_CHECK(ncclCommUserRank(comm, &rank));
    // One rank: the sum and the average are the tensors themselves, and NCCL would still run a
    // kernel over them in place (about 0.2 ms a step for 100 M float gradients on an H200).
    if (ranks == 1 && (op == ncclSum || op == ncclAvg)) return;
    for_each_reduction_bucket(gradients, bucket_bytes, [&](std::size_t first, std::size_t last) {
        auto at = [&](std::size_t i, std::size_t elements) { return static_cast<char*>(gradients[i].data) + elements * element; };
        if (as == all_reduce_as::one_call) {
            in_one_group(first, last, [&](std::size_t i) {
                CAPSCOPE_CHECK(ncclAllReduce(gradients[i].data, gradients[i].data, gradients[i].bytes / element, type, op, comm, s));
            });
            return;
        }
        // Split: each rank's part is `part` elements; a tail past ranks * part is all-reduced. Two
        // groups, not one: within a group NCCL runs copy-engine tasks before kernels, so the
        // all-gathers would copy the parts before the reduce-scatters had reduced them.
        in_one_group(first, last, [&](std::size_t i) {
            const std::size_t count = gradients[i].bytes / element, part = count / std::size_t(ranks), split = part * std::size_t(ranks);
            if (part) CAPSCOPE_CHECK(ncclReduceScatter(gradients[i].data, at(i, std::size_t(rank) * part), part, type, op, comm, s));
            if (split < count) CAPSCOPE_CHECK(ncclAllReduce(at(i, split), at(i, split), count - split, type, op, comm, s));
        });
        in_one_group(first, last, [&](std::size_t i) {
            const std::size_t part = gradients[i].bytes / element / std::size_t(ranks);
            if (part) CAPSCOPE_CHECK(ncclAllGather(at(i, std::size_t(rank) * part), gradients[i].data, part, type, comm, s));
        });
    });
}

//! The hook's name, shown in the plan and so in its fingerprint: the type and the operation, so
//! ranks that would reduce differently do not fingerprint alike.
constexpr std::string_view reduction_hook_name(ncclDataType_t type, ncclRedOp_t op) {
    if (op == ncclAvg) {
        if (type == ncclFloat32) return "grad all-reduce (float32, avg)";
        if (type == ncclBfloat16) return "grad all-reduce (bfloat16, avg)";
        if (type == ncclFloat16) return "grad all-reduce (float16, avg)";
    }
    if (op == ncclSum) {
        if (type == ncclFloat32) return "grad all-reduce (float32, sum)";
        if (type == ncclBfloat16) return "grad all-reduce (bfloat16, sum)";
        if (type == ncclFloat16) return "grad all-reduce (float16, sum)";
        if (type == ncclInt32) return "grad all-reduce (int32, sum)";
    }
    return "grad all-reduce (other type or operation)";
}

struct gradient_reduction {
    ncclComm_t comm;
    std::size_t bucket_bytes;
    ncclDataType_t type;
    ncclRedOp_t op;
    all_reduce_as as = all_reduce_as::one_call;
    std::shared_ptr<const all_to_all_sum> all_to_all = {}; //!< with all_to_all_then_all_gather: its scratch and cuBLAS handle
    void operator()(backward_context& c) const {
        if (as == all_reduce_as::all_to_all_then_all_gather) all_to_all->run(c.gradients(), bucket_bytes, c.stream());
        else all_reduce_buckets(comm, c.gradients(), type, op, bucket_bytes, c.stream(), as);
    }
    std::string collective_calls(int) const {
        return bucket_words(bucket_bytes) + (as == all_reduce_as::one_call                       ? ""
                                             : as == all_reduce_as::reduce_scatter_then_all_gather ? ", each a reduce-scatter then an all-gather"
                                                                                                   : ", each an all-to-all, a sum, then an all-gather");
    }
};

inline void check_type(ncclDataType_t type, const char* who) {
    if (nccl_type_bytes(type) == 0) throw std::invalid_argument(std::string(who) + ": unsupported NCCL data type " + std::to_string(int(type)));
}
} // namespace detail

//! The data-parallel backward hook: reduces (`op`, by default the average) each layer's gradients
//! of type `type` across the ranks of `comm`, after the layer's backward in the step's last
//! microbatch, on the runner's side stream `Lane` (so it overlaps the backward of the layers
//! before it; the optimizer waits for it). `as`: one all-reduce per tensor, a reduce-scatter
//! and an all-gather, or an all-to-all, a local sum and an all-gather (see `all_reduce_as`; this
//! one keeps a scratch window of `largest_layer_bytes`, the most bytes one layer's gradients
//! take, made here on every rank).
template <int Lane = 1>
auto gradient_all_reduce(const cuda::nccl_communicator& comm, ncclDataType_t type = ncclFloat32, ncclRedOp_t op = ncclAvg,
                         std::size_t bucket_bytes = std::size_t(40) << 20, all_reduce_as as = all_reduce_as::one_call,
                         std::size_t largest_layer_bytes = 0) {
    detail::check_type(type, "gradient_all_reduce");
    std::shared_ptr<const detail::all_to_all_sum> all_to_all;
    if (as == all_reduce_as::all_to_all_then_all_gather) all_to_all = std::make_shared<const detail::all_to_all_sum>(comm, type, op, largest_layer_bytes);
    return hook<hook_phase::backward, capturable, on_lane<Lane>, last_microbatch_only>(
        detail::reduction_hook_name(type, op), detail::gradient_reduction{comm.get(), bucket_bytes, type, op, as, std::move(all_to_all)});
}

//! The reduction of gradients outside the layers (an embedding, a head), once per step: a stage
//! for the step's end, before the optimizer, on side stream `lane`. It declares the gradients it
//! reduces, and the optimizer (a step_end stage: it touches every gradient) waits for it wherever
//! it stands (capscope/plan/stream_order.hpp). It keeps the list of gradients, so it must outlive
//! the stage.
class step_gradient_all_reduce {
public:
    step_gradient_all_reduce(const cuda::nccl_communicator& comm, std::vector<tensor_ref> gradients, ncclDataType_t type = ncclFloat32,
                             ncclRedOp_t op = ncclAvg, std::size_t bucket_bytes = std::size_t(40) << 20)
        : comm_(comm.get()), gradients_(std::move(gradients)), type_(type), op_(op), bucket_bytes_(bucket_bytes) {
        detail::check_type(type, "step_gradient_all_reduce");
        require_whole_elements(gradients_, detail::nccl_type_bytes(type), "step_gradient_all_reduce");
    }
    step_gradient_all_reduce(const step_gradient_all_reduce&) = delete; // its stage points to it
    step_gradient_all_reduce& operator=(const step_gradient_all_reduce&) = delete;

    void run(cudaStream_t s) { detail::all_reduce_buckets(comm_, gradients_, type_, op_, bucket_bytes_, s); }
    //! A step-level stage (outside the layers: captured only by the whole iteration) named `name`.
    stage to_stage(std::string name = "grad all-reduce (outside the layers)", int lane = 1) {
        stage st;
        // The type and the operation, as the hooks' names give them: "(float32, avg)".
        st.name = std::move(name) + " " + std::string(detail::reduction_hook_name(type_, op_).substr(std::string_view("grad all-reduce ").size()));
        st.kind = stage_kind_id("collective");
        st.lane = lane;
        st.forward = stream_fn::of<&step_gradient_all_reduce::run>(this);
        st.inputs = gradients_;
        st.outputs = gradients_;
        st.collective_calls = detail::bucket_words(bucket_bytes_);
        st.buffers_declared = true;
        return st;
    }

private:
    ncclComm_t comm_;
    std::vector<tensor_ref> gradients_;
    ncclDataType_t type_;
    ncclRedOp_t op_;
    std::size_t bucket_bytes_;
};

} // namespace capscope
