#pragma once
//! @file
//! A pipeline rank's step on the GPU: its passes, and before each pass its groups of sends and
//! receives, in the order `pipeline::program_of` gives and `pipeline::check_replay` simulated, on
//! the communicators `pipeline::choose_communicators` picks for the shape and count. A stream
//! capture of `run` holds the sends and receives inside the graph, and a replay issues them in
//! that order. The constructor refuses a shape whose replay would not complete on its
//! communicators, naming the two operations, before anything is sent.
//!
//! Shared (one communicator; every shape the rules accept, grouped as Megatron groups them):
//! everything on the one stream `run` is given, each pass after the group before it, each group
//! after the pass before it.
//!
//! Per edge (a communicator per directed rank-to-rank edge and kind of traffic, split from the
//! world's: what other groupings need, such as sends and receives one by one): each edge has its
//! own stream, and `run` keeps the contract the replay check simulated (replay_check.hpp):
//! - a group's operations on one edge are one NCCL group on that edge's stream, issued after the
//!   pass the group follows (the edge's stream waits for the step's);
//! - a pass waits for the edges of its receives only, for the group that holds them;
//! - a pass that computes a send into a buffer an earlier send of the step reads waits for that
//!   send (found by the buffers' addresses), never for the end of the step and never by polling;
//! - the step's stream waits for every edge it used before `run` returns.
//! That wait can close a cycle the plain check does not see, so every check of a schedule holds it
//! at its worst (`pipeline::check_as_issued`), and the constructor refuses what would hang. The caller keeps
//! the rest: a pass writes a send's buffer only when it computes that send, and a buffer serves
//! one edge and kind of traffic (one sent on two edges in a step is refused).

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/cuda/nccl.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/pipeline/edge_plan.hpp>
#include <capscope/pipeline/issued_order.hpp>
#include <capscope/pipeline/p2p_buffer.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/replay_check.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace capscope {

class pipeline_p2p {
public:
    //! `world`: the pipeline's ranks (pipeline rank r is rank r of `world`). Refuses, on every
    //! rank alike, a shape whose sends and receives would deadlock or cross when issued on the
    //! communicators chosen for `microbatches` microbatches. Per edge, it splits the edges'
    //! communicators from `world` (a collective call per edge, the same on every rank).
    pipeline_p2p(const cuda::nccl_communicator& world, const pipeline::schedule_shape& shape, int microbatches)
        : world_(world), shape_(shape), rank_(world.rank()) {
        if (world.size() != shape.ranks)
            throw std::invalid_argument("capscope pipeline: the schedule has " + std::to_string(shape.ranks) + " ranks, the communicator " +
                                        std::to_string(world.size()) + " -- fix: one pipeline rank per rank of the communicator");
        pipeline::require_rules(shape, microbatches);
        // (A test, broken on purpose, issues on one communicator what its check refused: does the predicted hang happen?)
        const bool skip = detail::installed_breakage().skip_replay_check;
        const pipeline::communicator_plan plan = skip ? pipeline::communicator_plan{pipeline::communicator_layout::shared, {}}
                                                      : pipeline::choose_communicators(shape, microbatches);
        layout_ = plan.layout;
        // (The verdict is as this issuer issues: per edge, with the send-buffer waits of run.)
        if (!plan.verdict.completes())
            throw std::invalid_argument("capscope pipeline rule PP6: issued on " +
                                        std::string(layout_ == pipeline::communicator_layout::shared
                                                        ? "one communicator and one stream per rank"
                                                        : "a communicator and a stream per edge, where the pass that computes a send waits "
                                                          "until the edge's previous send from that buffer has completed") +
                                        ", " + pipeline::describe(plan.verdict) +
                                        " -- fix: group the sends and receives as Megatron does (p2p_grouping::megatron, the default), "
                                        "which completes on one communicator for every shape the rules accept" +
                                        (shape.communicators == pipeline::communicator_choice::shared ? ", or communicator_choice::automatic" : "") +
                                        (layout_ == pipeline::communicator_layout::per_edge ? ", or fewer microbatches in flight (a smaller group)" : ""));
        program_ = pipeline::program_of(shape, rank_, microbatches);
        if (layout_ == pipeline::communicator_layout::per_edge) make_edges(pipeline::programs_of(shape, microbatches));
    }
    pipeline_p2p(pipeline_p2p&&) = default; // the edges' communicators are its own: moved, never copied
    pipeline_p2p& operator=(pipeline_p2p&&) = delete;

    const pipeline::rank_program& program() const noexcept { return program_; }
    pipeline::communicator_layout layout() const noexcept { return layout_; }
    //! Per edge: the edges this rank sends or receives on.
    int edges() const noexcept { return int(edges_.size()); }
    //! Aborts the edges' communicators (per edge; from any thread), all at once, waiting at
    //! most `bound` for NCCL's aborts (cuda::nccl_communicator::abort_all); true when they all
    //! returned. Aborting the world's does too, as they are split from it: the step watchdog
    //! frees a rank waiting on an edge.
    bool abort_edges(std::chrono::milliseconds bound = std::chrono::milliseconds(5'000)) const noexcept {
        std::vector<const cuda::nccl_communicator*> comms;
        try {
            for (const edge& e : edges_) comms.push_back(&e.comm);
        } catch (...) { // no memory: one after another
            bool returned = true;
            for (const edge& e : edges_) returned = e.comm.abort(bound) && returned;
            return returned;
        }
        return cuda::nccl_communicator::abort_all(comms, bound);
    }

    //! Issues one group on `stream`, the shared layout's way: `buffer_of(op)` says where each
    //! operation reads or writes. Per edge, a group alone cannot keep the contract: use `run`.
    template <class Buffers>
    void issue(const pipeline::p2p_group& g, Buffers&& buffer_of, cudaStream_t stream) const {
        if (layout_ != pipeline::communicator_layout::shared)
            throw std::logic_error("capscope pipeline: this schedule's sends and receives go on a communicator per edge, whose order "
                                   "`run` keeps across groups and passes; issue() puts a group on one stream -- fix: run(), or Megatron's grouping");
        auto calls = [&] {
            for (const pipeline::p2p_op& op : g.ops) {
                const p2p_buffer b = buffer_of(op);
                if (op.send) CAPSCOPE_CHECK(ncclSend(b.data, b.bytes, ncclUint8, op.m.to, world_.get(), stream));
                else CAPSCOPE_CHECK(ncclRecv(b.data, b.bytes, ncclUint8, op.m.from, world_.get(), stream));
            }
        };
        // (Eagerly, after a phase graph's launch, NCCL's rules without graph mixing: cuda/nccl_graph_mixing.hpp.)
        order_.eager(stream, [&] {
            if (shape_.grouping == pipeline::p2p_grouping::one_by_one) calls(); // each group holds one operation
            else cuda::in_nccl_group(calls);
        });
    }

    //! Proves on the host that the step as `run` issues it, with the buffers `buffer_of` gives,
    //! orders every two touches of one buffer (pipeline/issued_order.hpp: a slot reused while its
    //! reader may still run, a send buffer rewritten while it is sent, one buffer for two
    //! operations of a group), and throws std::logic_error naming them if not. `run` calls it;
    //! it proves again only when a buffer has moved since (no allocation then).
    template <class Buffers>
    void check_buffers(Buffers&& buffer_of) const {
        seen_.clear();
        for (const pipeline::p2p_group& g : program_.groups)
            for (const pipeline::p2p_op& op : g.ops) seen_.push_back(buffer_of(op));
        const auto same = [](const p2p_buffer& a, const p2p_buffer& b) { return a.data == b.data && a.bytes == b.bytes; };
        if (proven_ && std::equal(seen_.begin(), seen_.end(), proven_->begin(), proven_->end(), same)) return;
        if (const std::optional<std::string> unordered = pipeline::check_issued_order(
                shape_, program_, layout_, layout_ == pipeline::communicator_layout::per_edge ? &plan_ : nullptr, buffer_of))
            throw std::logic_error(*unordered);
        proven_ = seen_;
    }

    //! The rank's whole step on `stream`: before each pass its groups, then the pass
    //! (`pass(action, stream)`), then the last groups. The buffers are proven first
    //! (check_buffers).
    template <class Buffers, class Pass>
    void run(Buffers&& buffer_of, Pass&& pass, cudaStream_t stream) const {
        check_buffers(buffer_of);
        if (layout_ == pipeline::communicator_layout::shared) {
            std::size_t next = 0;
            for (int k = 0; k <= int(program_.compute.size()); ++k) {
                while (next < program_.groups.size() && program_.groups[next].after == k - 1) issue(program_.groups[next++], buffer_of, stream);
                if (k < int(program_.compute.size())) pass(program_.compute[std::size_t(k)], stream);
            }
            return;
        }
        last_send_.clear();
        for (edge& e : edges_) e.used = false;
        std::size_t next = 0;
        const int n = int(program_.compute.size());
        for (int k = 0; k <= n; ++k) {
            if (next < plan_.parts.size() && plan_.parts[next].after == k - 1) {
                fork_->record(stream); // the edges' groups come after the pass before them
                for (; next < plan_.parts.size() && plan_.parts[next].after == k - 1; ++next) issue_part(next, buffer_of);
            }
            if (k == n) break;
            if (!detail::installed_breakage().drop_edge_waits) // (a test, broken on purpose)
                for (int p : plan_.receives_for[std::size_t(k)]) part_done_[std::size_t(p)].wait_on(stream);
            for (const pipeline::part_send& w : plan_.sends_of[std::size_t(k)]) { // this pass writes what an earlier send reads
                const void* at = buffer_of(plan_.parts[std::size_t(w.part)].ops[w.op]).data;
                for (const sent& earlier : last_send_)
                    if (earlier.buffer == at) part_done_[std::size_t(earlier.part)].wait_on(stream);
            }
            pass(program_.compute[std::size_t(k)], stream);
        }
        for (edge& e : edges_)
            if (e.used) { // the step's stream waits for every edge it forked
                e.joined.record(e.stream);
                e.joined.wait_on(stream);
            }
    }

private:
    struct edge {
        int lane = 0, peer = 0; //!< the peer's rank in the edge's communicator
        cuda::nccl_communicator comm;
        cuda::stream stream;
        cuda::event joined;
        bool used = false;
    };

    void make_edges(const std::vector<pipeline::rank_program>& programs) {
        plan_ = pipeline::plan_edges(shape_, programs, rank_);
        // Every rank splits every used edge, in the same order; the edge's two ranks keep it.
        std::vector<int> edge_of(std::size_t(pipeline::detail::lane_count(shape_, pipeline::communicator_layout::per_edge)), -1);
        for (const pipeline::p2p_edge& e : plan_.edges) {
            const bool member = rank_ == e.from || rank_ == e.to;
            std::optional<cuda::nccl_communicator> c = cuda::nccl_communicator::split(world_, member ? e.lane : cuda::nccl_communicator::no_color, rank_);
            if (!member) continue;
            if (!c) throw std::logic_error("capscope pipeline: ncclCommSplit gave no communicator to a rank of its edge");
            const int peer = rank_ == e.from ? e.to : e.from;
            edge_of[std::size_t(e.lane)] = int(edges_.size());
            edges_.push_back({e.lane, peer < rank_ ? 0 : 1, std::move(*c), cuda::stream{}, cuda::event{}, false});
        }
        for (const pipeline::edge_part& p : plan_.parts) edge_index_.push_back(edge_of[std::size_t(p.lane)]);
        part_done_.resize(plan_.parts.size());
        fork_ = std::make_unique<cuda::event>();
        last_send_.reserve(plan_.parts.size() * 4);
    }

    template <class Buffers>
    void issue_part(std::size_t p, Buffers& buffer_of) const {
        const pipeline::edge_part& pt = plan_.parts[p];
        edge& e = edges_[std::size_t(edge_index_[p])];
        fork_->wait_on(e.stream);
        e.used = true;
        order_.eager(e.stream, [&] { // (NCCL's rules without graph mixing: cuda/nccl_graph_mixing.hpp)
            cuda::in_nccl_group([&] {
                for (const pipeline::p2p_op& op : pt.ops) {
                    const p2p_buffer b = buffer_of(op);
                    if (op.send) CAPSCOPE_CHECK(ncclSend(b.data, b.bytes, ncclUint8, e.peer, e.comm.get(), e.stream));
                    else CAPSCOPE_CHECK(ncclRecv(b.data, b.bytes, ncclUint8, e.peer, e.comm.get(), e.stream));
                }
            });
        });
        part_done_[p].record(e.stream);
        for (const pipeline::p2p_op& op : pt.ops) {
            if (!op.send) continue;
            const void* at = buffer_of(op).data;
            for (const sent& earlier : last_send_)
                if (earlier.buffer == at && earlier.lane != pt.lane) // a wait the replay check does not hold
                    throw std::logic_error("capscope pipeline: one buffer is sent on two edges in a step; per edge, a send's buffer serves "
                                           "one edge and kind of traffic -- fix: a buffer per edge (or per slot) for what each pass sends");
            last_send_.push_back({at, int(p), pt.lane});
        }
    }

    const cuda::nccl_communicator& world_;
    cuda::nccl_launch_order order_;
    pipeline::schedule_shape shape_;
    int rank_ = 0;
    pipeline::communicator_layout layout_ = pipeline::communicator_layout::shared;
    pipeline::rank_program program_;
    // Per edge only.
    mutable std::vector<edge> edges_;
    pipeline::edge_plan plan_;                          //!< parts, and what each pass waits for (pipeline/edge_plan.hpp)
    std::vector<int> edge_index_;                       //!< per part: its edge in edges_
    std::vector<cuda::event> part_done_;                //!< per part: recorded on its edge's stream after it
    std::unique_ptr<cuda::event> fork_;                 //!< recorded on the step's stream before a pass's parts
    struct sent {
        const void* buffer;
        int part, lane;
    };
    mutable std::vector<sent> last_send_; //!< this step's sends so far
    mutable std::vector<p2p_buffer> seen_;                //!< check_buffers: every operation's buffer, in program order
    mutable std::optional<std::vector<p2p_buffer>> proven_; //!< the buffers last proven ordered
};

} // namespace capscope
