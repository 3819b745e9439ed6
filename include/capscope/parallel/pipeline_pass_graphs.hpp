#pragma once
//! @file
//! A pipeline rank's passes as graphs, one per chunk, direction and slot, with the sends and
//! receives issued eagerly between them: the `local` and `transformer_engine` impls of a pipelined
//! step (Megatron-LM's chunk graphs, TransformerEngine's `make_graphed_callables(_order=...)`).
//! The step's order is `pipeline::program_of`'s, as `pipeline_p2p::run` issues it; only each
//! pass becomes a graph launch.
//!
//! Which graph a pass replays is derived from the slot plan, not named by the caller: a pass is
//! its chunk, its direction, the activation slot of its microbatch and, for a backward, the slot
//! its received gradient waits in (`pipeline::plan_slots`). Passes with the same four share one
//! graph. The contract that makes that right, as for the phases: `pass` (and the step's buffers)
//! must address a microbatch's buffers by those slots, as `activation_slot` and `gradient_slot`
//! give them, and what else varies with the microbatch (the sample the first stage loads) is read
//! on the device, because a captured host value never changes.
//!
//! - `pass_capture::lazily` (`local`): a pass is captured the first time it runs.
//! - `pass_capture::ahead_of_time` (`transformer_engine`): every distinct pass is captured before
//!   the first step, in the order the schedule first runs it.
//! The graphs hold no collective, so their launches never wait on the host (graph_copy.hpp).

#include <capscope/cuda/graph.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/pipeline/activation_slots.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope {

enum class pass_capture {
    lazily,        //!< `local`: at a pass's first run
    ahead_of_time, //!< `transformer_engine`: all before the first step, in schedule order
};

class pipeline_pass_graphs {
public:
    //! Refuses what `pipeline_p2p` refuses (the rules, a replay that would not complete).
    pipeline_pass_graphs(const cuda::nccl_communicator& world, const pipeline::schedule_shape& shape, int microbatches, pass_capture when)
        : p2p_(world, shape, microbatches), when_(when), chunks_(shape.virtual_stages), microbatches_(microbatches) {
        const pipeline::slot_plan plan = pipeline::plan_slots(shape, world.rank(), microbatches);
        const std::size_t chunks = std::size_t(shape.virtual_stages), mbs = std::size_t(microbatches);
        activation_.assign(chunks * mbs, -1);
        gradient_.assign(chunks * mbs, -1);
        for (const pipeline::slot_use& u : plan.uses) activation_[std::size_t(u.chunk) * mbs + std::size_t(u.microbatch)] = u.slot;
        for (const pipeline::gradient_use& u : plan.gradients) gradient_[std::size_t(u.chunk) * mbs + std::size_t(u.microbatch)] = u.slot;
        for (const pipeline::compute_action& a : p2p_.program().compute) {
            const std::size_t at = std::size_t(a.chunk) * mbs + std::size_t(a.microbatch);
            pass_key key{a.direction, a.chunk, activation_[at], a.direction == pipeline::pass::backward ? gradient_[at] : -1};
            if (detail::installed_breakage().pass_graph_per_chunk) key.activation_slot = key.gradient_slot = -1; // a test, broken on purpose
            std::size_t g = 0;
            while (g < keys_.size() && !(keys_[g] == key)) ++g;
            if (g == keys_.size()) {
                keys_.push_back(key);
                first_run_.push_back(a);
            }
            graph_of_.push_back(g);
        }
        execs_.resize(keys_.size());
    }

    const pipeline::rank_program& program() const noexcept { return p2p_.program(); }
    //! Distinct passes: the graphs a step needs.
    int distinct_passes() const noexcept { return int(keys_.size()); }
    int graphs_captured() const noexcept { return captures_; }
    int chunks() const noexcept { return chunks_; }
    int microbatches() const noexcept { return microbatches_; }

    //! The slots the graphs are keyed by, which `pass` and the step's buffers must address by: the
    //! activation slot of chunk `chunk`'s microbatch `microbatch` on this rank (the first stage's
    //! too, where it loads its sample), -1 where the plan gives none; the slot its received
    //! gradient waits in, -1 where none (the last stage receives no gradient). Out of range:
    //! `std::out_of_range`.
    int activation_slot(int chunk, int microbatch) const { return activation_[index_of(chunk, microbatch, "activation_slot")]; }
    int gradient_slot(int chunk, int microbatch) const { return gradient_[index_of(chunk, microbatch, "gradient_slot")]; }

    //! One step on `stream`: before each pass its groups of sends and receives, issued eagerly
    //! (`pipeline_p2p::run`, on the communicators it chose), then the pass's graph (captured here
    //! first, lazily or all ahead of time).
    template <class Buffers, class Pass>
    void step(Buffers&& buffer_of, Pass&& pass, cudaStream_t stream) {
        if (when_ == pass_capture::ahead_of_time && captures_ == 0)
            for (std::size_t g = 0; g < keys_.size(); ++g) capture(g, pass, stream);
        std::size_t k = 0;
        p2p_.run(buffer_of, [&](const pipeline::compute_action&, cudaStream_t on) {
            const std::size_t g = graph_of_[k++];
            if (!execs_[g]) capture(g, pass, on);
            execs_[g].launch(on);
        }, stream);
    }
    const pipeline_p2p& p2p() const noexcept { return p2p_; }

private:
    std::size_t index_of(int chunk, int microbatch, const char* what) const {
        if (chunk < 0 || chunk >= chunks_ || microbatch < 0 || microbatch >= microbatches_)
            throw std::out_of_range(std::string("capscope pipeline_pass_graphs::") + what + "(" + std::to_string(chunk) + ", " +
                                    std::to_string(microbatch) + "): outside " + std::to_string(chunks_) + " chunk(s) x " +
                                    std::to_string(microbatches_) + " microbatch(es) -- fix: ask for a chunk in [0, chunks()) and a "
                                    "microbatch in [0, microbatches()), the count these graphs were made for");
        return std::size_t(chunk) * std::size_t(microbatches_) + std::size_t(microbatch);
    }

    struct pass_key {
        pipeline::pass direction = pipeline::pass::forward;
        int chunk = 0, activation_slot = -1, gradient_slot = -1;
        friend constexpr bool operator==(const pass_key&, const pass_key&) = default;
    };

    template <class Pass>
    void capture(std::size_t g, Pass& pass, cudaStream_t stream) {
        const pipeline::compute_action a = first_run_[g];
        execs_[g] = cuda::graph_exec(cuda::capture(stream, [&](cudaStream_t on) { pass(a, on); }));
        ++captures_;
    }

    pipeline_p2p p2p_;
    pass_capture when_;
    int chunks_, microbatches_;
    std::vector<int> activation_, gradient_; //!< per (chunk, microbatch): its slots, -1 where none
    std::vector<pass_key> keys_;
    std::vector<pipeline::compute_action> first_run_; //!< per graph: the pass it is captured from
    std::vector<std::size_t> graph_of_;               //!< per pass of the program: its graph
    std::vector<cuda::graph_exec> execs_;
    int captures_ = 0;
};

} // namespace capscope
