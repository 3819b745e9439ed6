#pragma once
//! @file
//! A 1F1B or interleaved 1F1B rank's step as graphs captured once, for every microbatch count
//! the layout serves (`phase_layout::serves`: from the ranks up for 1F1B; interleaved, whole groups
//! from its least count): the warmup, P steady iterations, and the tails that those counts reach
//! (pipeline/phases.hpp), each with its sends and receives inside as NCCL groups (pipeline_p2p.hpp).
//! `launch(M)` replays the warmup, the steady variant of each of the chunks x M - warmup - 1
//! steady iterations, and the tail, on one stream, with no capture and no allocation. Memory is
//! the slots', the same for every count.
//!
//! The contract that lets one graph serve many microbatches: `buffer_of` and `pass` address a
//! microbatch's activations by `layout().activation_slot(chunk, k)` and its received gradient by
//! `layout().gradient_slot(chunk, k)`. Whatever else varies with the microbatch (the sample the first
//! stage loads, the target the last compares with) is read on the device, e.g. through a counter
//! the first stage's load advances, because a captured host value never changes.

#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/parallel/pipeline_p2p.hpp>
#include <capscope/pipeline/phases.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope {

class pipeline_phase_graphs {
public:
    //! Refuses what `pipeline_p2p` refuses, and schedules whose steady state does not repeat
    //! (1F1B and interleaved 1F1B grouped as Megatron does are cut into phases).
    pipeline_phase_graphs(const cuda::nccl_communicator& world, const pipeline::schedule_shape& shape)
        : world_(world), shape_(shape), rank_(world.rank()), layout_(pipeline::phase_layout_of(shape, world.rank())) {
        // A phase issues its groups on one stream: one communicator (Megatron's grouping completes on
        // one; a shape that names per-edge communicators would be split for nothing, then refused
        // inside a capture).
        if (shape.communicators == pipeline::communicator_choice::per_edge)
            throw std::invalid_argument("capscope pipeline_phase_graphs: the phases issue their sends and receives on one communicator, and "
                                        "this shape names one per edge -- fix: communicator_choice::automatic or shared");
        // The rules and the replay check of the least count (each count a phase is captured from is checked too).
        (void)pipeline_p2p(world, shape, layout_.least_microbatches);
    }

    const pipeline::phase_layout& layout() const noexcept { return layout_; }
    int graphs_captured() const noexcept { return captures_; }

    //! Captures every phase on `stream`: the warmup, then each steady and tail variant. NCCL's
    //! connections must be open (one eager step first, as for any captured send).
    template <class Buffers, class Pass>
    void capture(Buffers&& buffer_of, Pass&& pass, cudaStream_t stream) {
        if (warmup_) throw std::logic_error("capscope pipeline: the phases are captured once; they serve every count");
        std::vector<int> proven; // the counts whose programs' buffers are proven ordered (phases share counts)
        warmup_.emplace(capture_phase({pipeline::phase_kind::warmup, 0}, buffer_of, pass, stream, proven));
        steady_.reserve(std::size_t(layout_.period));
        tail_.resize(std::size_t(layout_.period));
        for (int v = 0; v < layout_.period; ++v) steady_.push_back(capture_phase({pipeline::phase_kind::steady, v}, buffer_of, pass, stream, proven));
        for (int v = 0; v < layout_.period; ++v) // interleaved, whole groups reach only some tails
            if (pipeline::count_holding(shape_, rank_, {pipeline::phase_kind::tail, v}) > 0)
                tail_[std::size_t(v)].emplace(capture_phase({pipeline::phase_kind::tail, v}, buffer_of, pass, stream, proven));
    }

    //! One step of `microbatches` microbatches on `stream`: launches only.
    void launch(int microbatches, cudaStream_t stream) const {
        launch(microbatches, stream, [](cudaStream_t) {});
    }
    //! The same, calling `before_each(stream)` before each graph launch (a test's late rank).
    template <class Before>
    void launch(int microbatches, cudaStream_t stream, Before&& before_each) const {
        if (!warmup_) throw std::logic_error("capscope pipeline: launch before capture -- fix: call capture() once, after one eager step");
        if (!layout_.serves(microbatches))
            throw std::invalid_argument("capscope pipeline: the phases serve " + std::to_string(layout_.least_microbatches) + " microbatches or more" +
                                        (layout_.group > 1 ? " in whole groups of " + std::to_string(layout_.group) : std::string()) +
                                        ", and this step has " + std::to_string(microbatches) + " -- fix: " +
                                        (layout_.group > 1 ? "a multiple of the group, at least " + std::to_string(layout_.least_microbatches)
                                                           : std::string("at least as many microbatches as ranks")));
        const int steady = layout_.chunks * microbatches - layout_.warmup;
        const bool one_variant = detail::installed_breakage().one_phase_variant; // (a test, broken on purpose)
        auto variant = [&](int j) { return std::size_t(one_variant ? 0 : layout_.variant_of(j)); };
        before_each(stream);
        order_.launch(*warmup_, stream); // (NCCL's rules without graph mixing: cuda/nccl_graph_mixing.hpp)
        for (int j = 0; j + 1 < steady; ++j) {
            before_each(stream);
            order_.launch(steady_[variant(j)], stream);
        }
        before_each(stream);
        std::size_t tail = variant(steady - 1);
        if (!tail_[tail]) tail = std::size_t(layout_.variant_of(steady - 1)); // (broken on purpose: a tail variant 0 may not exist)
        if (!tail_[tail]) throw std::logic_error("capscope pipeline: no tail captured for " + std::to_string(microbatches) + " microbatches"); // phases.hpp's test says never
        order_.launch(*tail_[tail], stream);
    }

private:
    template <class Buffers, class Pass>
    cuda::graph_exec capture_phase(pipeline::phase_key key, Buffers& buffer_of, Pass& pass, cudaStream_t stream, std::vector<int>& proven) {
        const int m = pipeline::count_holding(shape_, rank_, key);
        const pipeline_p2p p2p(world_, shape_, m); // this count's rules and replay, checked
        if (std::find(proven.begin(), proven.end(), m) == proven.end()) {
            p2p.check_buffers(buffer_of); // and its buffers' order (the phase layout's slots)
            proven.push_back(m);
        }
        const pipeline::rank_program& program = p2p.program();
        for (const pipeline::phase_segment& seg : pipeline::phases_of(shape_, rank_, m)) {
            if (!(seg.key == key)) continue;
            cuda::graph g = cuda::capture(stream, [&](cudaStream_t on) {
                for (const pipeline::p2p_group& grp : seg.groups)
                    if (grp.after < seg.first_pass) p2p.issue(grp, buffer_of, on);
                for (int k = seg.first_pass; k < seg.end_pass; ++k) {
                    pass(program.compute[std::size_t(k)], on);
                    for (const pipeline::p2p_group& grp : seg.groups)
                        if (grp.after == k) p2p.issue(grp, buffer_of, on);
                }
            });
            ++captures_;
            // A phase holds NCCL's user object; launched from a copy without it, a step of more than
            // 28 phases does not make the host wait (cuda/graph_copy.hpp).
            cuda::graph_exec exec(detail::installed_breakage().keep_user_objects ? std::move(g) : cuda::without_user_objects(std::move(g)).copy);
            order_.captured();
            return exec;
        }
        throw std::logic_error("capscope pipeline: no phase for its key in the count chosen to hold it"); // phases.hpp's test says never
    }

    const cuda::nccl_communicator& world_;
    cuda::nccl_launch_order order_;
    pipeline::schedule_shape shape_;
    int rank_ = 0;
    pipeline::phase_layout layout_;
    std::optional<cuda::graph_exec> warmup_;
    std::vector<cuda::graph_exec> steady_;
    std::vector<std::optional<cuda::graph_exec>> tail_; //!< per variant: the tails a served count reaches
    int captures_ = 0;
};

} // namespace capscope
