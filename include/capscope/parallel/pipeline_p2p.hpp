#pragma once
//! @file
//! A pipeline rank's step on the GPU: its passes, and before each pass its group of sends and
//! receives as one NCCL group (`ncclGroupStart` ... `ncclGroupEnd`), in the order
//! `pipeline::program_of` gives and `pipeline::check_replay` simulated. Everything goes on the
//! one stream it is given, so a stream capture of `run` holds the sends and receives inside the
//! graph, and a replay issues them in that order.
//!
//! One stream per rank is the shared layout's order (replay_check.hpp): one communicator, each
//! pass after the group before it, each group after the pass before it. The constructor refuses
//! a shape whose replay would not complete on it, naming the two operations, before anything
//! is sent. Grouped as Megatron groups them (the shape's default), every shape the rules accept
//! completes on one communicator, interleaved included. (Per-edge communicators, which other
//! groupings may need, take a stream per communicator: not issued here.)

#include <capscope/cuda/error.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace capscope {

//! Where a send reads, or a receive writes, and how many bytes.
struct p2p_buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
};

class pipeline_p2p {
public:
    //! `world`: the pipeline's ranks (pipeline rank r is rank r of `world`). Refuses, on every
    //! rank alike, a shape whose sends and receives would deadlock or cross when issued this way
    //! with `microbatches` microbatches.
    pipeline_p2p(const cuda::nccl_communicator& world, const pipeline::schedule_shape& shape, int microbatches)
        : world_(world), shape_(shape), rank_(world.rank()) {
        if (world.size() != shape.ranks)
            throw std::invalid_argument("capscope pipeline: the schedule has " + std::to_string(shape.ranks) + " ranks, the communicator " +
                                        std::to_string(world.size()) + " -- fix: one pipeline rank per rank of the communicator");
        pipeline::require_rules(shape, microbatches);
        if (shape.communicators == pipeline::communicator_choice::per_edge)
            throw std::invalid_argument("capscope pipeline: per-edge communicators need a stream per communicator, which pipeline_p2p does "
                                        "not issue yet -- fix: communicator_choice::shared or automatic, on a schedule that completes on one");
        const pipeline::replay_verdict v = pipeline::check_replay(shape, microbatches, pipeline::communicator_layout::shared);
        if (!v.completes() && !detail::installed_breakage().skip_replay_check) // (a test, broken on purpose: does the predicted hang happen?)
            throw std::invalid_argument("capscope pipeline rule PP6: issued on one communicator and one stream per rank, " + pipeline::describe(v) +
                                        " -- fix: group the sends and receives as Megatron does (p2p_grouping::megatron, the default), "
                                        "which completes on one communicator for every shape the rules accept");
        program_ = pipeline::program_of(shape, rank_, microbatches);
    }

    const pipeline::rank_program& program() const noexcept { return program_; }

    //! Issues one group on `stream`: `buffer_of(op)` says where each operation reads or writes.
    template <class Buffers>
    void issue(const pipeline::p2p_group& g, Buffers&& buffer_of, cudaStream_t stream) const {
        const bool together = shape_.grouping != pipeline::p2p_grouping::one_by_one;
        if (together) CAPSCOPE_CHECK(ncclGroupStart());
        for (const pipeline::p2p_op& op : g.ops) {
            const p2p_buffer b = buffer_of(op);
            if (op.send) CAPSCOPE_CHECK(ncclSend(b.data, b.bytes, ncclUint8, op.m.to, world_.get(), stream));
            else CAPSCOPE_CHECK(ncclRecv(b.data, b.bytes, ncclUint8, op.m.from, world_.get(), stream));
        }
        if (together) CAPSCOPE_CHECK(ncclGroupEnd());
    }

    //! The rank's whole step on `stream`: before each pass its group, then the pass
    //! (`pass(action, stream)`), then the last group.
    template <class Buffers, class Pass>
    void run(Buffers&& buffer_of, Pass&& pass, cudaStream_t stream) const {
        std::size_t next = 0;
        for (int k = 0; k <= int(program_.compute.size()); ++k) {
            while (next < program_.groups.size() && program_.groups[next].after == k - 1) issue(program_.groups[next++], buffer_of, stream);
            if (k < int(program_.compute.size())) pass(program_.compute[std::size_t(k)], stream);
        }
    }

private:
    const cuda::nccl_communicator& world_;
    pipeline::schedule_shape shape_;
    int rank_ = 0;
    pipeline::rank_program program_;
};

} // namespace capscope
