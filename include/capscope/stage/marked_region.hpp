#pragma once
//! @file
//! `marked_region`: a capture scope marked where a trainer's code stands. A trainer that owns its
//! layer loop keeps it, and wraps each piece of work in a call that names it:
//!
//!     for (int l = 0; l < layers; ++l)
//!         step.forward({.layer = l, .kind = stage_kind_id("block"), .reads = {...}, .writes = {...}},
//!                      [&](cudaStream_t s) { /* the loop body, as it was */ });
//!
//! The runner that takes these calls (capscope/run/in_place_runner.hpp) records them into the
//! same `training_program` a declared trainer builds (capscope/plan/recorded_program.hpp): a mark
//! is what a `stage` says about one pass, without the function, which stays in the trainer's code.
//! Host-only: the lists are views (a braced list lives to the end of the call that marks the
//! region), so a mark allocates nothing of its own.

#include <capscope/stage/saved_tensor.hpp>
#include <capscope/stage/stage_guard.hpp>
#include <capscope/stage/stage_kind.hpp>
#include <capscope/stage/tensor_ref.hpp>
#include <capscope/vocabulary/region.hpp>

#include <initializer_list>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

namespace capscope {

//! A read-only view of a list: a braced list `{a, b}` (alive to the end of the call that marks the
//! region) or any contiguous range the trainer keeps (`std::vector`, `std::array`, a span).
template <class T>
class list_view {
public:
    constexpr list_view() = default;
    constexpr list_view(std::initializer_list<T> l) noexcept : items_(l.begin(), l.size()) {} // NOLINT: a braced list
    constexpr list_view(std::span<const T> s) noexcept : items_(s) {}                        // NOLINT: a kept range
    template <class R>
        requires std::is_convertible_v<const R&, std::span<const T>>
    constexpr list_view(const R& r) noexcept : items_(std::span<const T>(r)) {} // NOLINT: a vector or an array
    constexpr std::span<const T> span() const noexcept { return items_; }
    constexpr auto begin() const noexcept { return items_.begin(); }
    constexpr auto end() const noexcept { return items_.end(); }
    constexpr std::size_t size() const noexcept { return items_.size(); }
    constexpr bool empty() const noexcept { return items_.empty(); }

private:
    std::span<const T> items_;
};

struct marked_region {
    int layer = -1;                          //!< -1: outside the layers (the embedding, the head, the loss, the optimizer)
    stage_kind_id kind;                      //!< a Megatron stage kind, or the trainer's own ("block", "loss")
    //! The stage's name in plans and errors; empty: "layer<L>.<kind>" (or the kind outside the layers).
    std::string_view name = {};
    //! The capture regions that contain it; empty: the region named like its kind.
    region_set regions = {};
    //! What this pass reads and writes besides its layer's parameters (read) and gradients (written
    //! by the backward): every buffer that may differ between microbatches or that other streams
    //! touch. A mark with neither list is undeclared (unless `buffers_declared`): ordered against
    //! all other work, and given a graph of its own in every microbatch.
    list_view<tensor_ref> reads = {};
    list_view<tensor_ref> writes = {};
    //! The lists name every such buffer, even when both are empty (a region bound to one set of
    //! buffers for the program's life): microbatches then share its graph where the lists agree.
    bool buffers_declared = false;
    //! The capture facts of `stage` (capscope/stage/stage.hpp): what keeps the region out of graphs.
    bool synchronizes_with_host = false;
    bool shapes_depend_on_data = false;
    bool passes_host_values = false;
    //! Passes host values (or is sized on the host) and is captured anyway: its code is recorded
    //! again, alone, each time a step reaches it in a graph, and put in place before the graph's
    //! launch (stage::updated_in_graph). Its work must go to the stream it is given.
    bool updated_in_graph = false;
    //! Other layers whose parameters it reads (a kernel fused across a block boundary: {layer + 1}).
    list_view<int> reads_parameters_of = {};
    //! Module inputs its forward keeps for the backward (activation offloading may move them), and
    //! those it writes that a later region of its layer keeps.
    list_view<saved_tensor> saves = {};
    offload_name_set makes = {};
    //! Runs only when a device flag holds (`run_if`); see stage_guard.
    stage_guard guard = {};
};

} // namespace capscope
