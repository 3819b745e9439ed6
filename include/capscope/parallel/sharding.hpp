#pragma once
//! @file
//! Sharded data parallelism (FSDP / ZeRO-3 style), host-only parts: the policy type, checked
//! against a configuration at compile time, and the layout of every rank's shard.
//!
//! Each rank owns a contiguous, equal-sized shard of every parameter's flat buffer (padded so that
//! NCCL's all-gather and reduce-scatter, which move equal counts per rank, need no special case).
//! Before a layer's forward, the layer's shards are gathered into a full buffer; per-layer graphs
//! replay on fixed addresses, so that buffer must be static: a double buffer allocated once, with
//! a persistent fallback when the pool misses (Megatron PR #4232, rules F1 and F2).

#include <capscope/config/config.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace capscope {

//! Where a layer's gathered parameters live.
struct static_double_buffer {};  //!< two buffers allocated at set-up, alternating by layer: fixed addresses
struct dynamic_gather_buffer {}; //!< allocated per gather: addresses change between steps
//! What happens when a gather does not fit the double buffer's pool.
struct persistent_buffer {}; //!< a buffer allocated once for it, kept: a fixed address
struct dynamic_buffer {};    //!< a fresh allocation each time
//! Before the backward: gather the layer's parameters again, or keep them from the forward.
struct regather_for_backward {};
struct keep_for_backward {};
//! When a layer's gather runs: while the layer before it in the pass computes (on the
//! communication lane, so the layer finds its parameters ready), or right before the layer.
struct prefetch_next_layer {};
struct gather_on_demand {};

template <class GatherInto = static_double_buffer, class OnPoolMiss = persistent_buffer, class Backward = regather_for_backward,
          class Gather = prefetch_next_layer>
struct sharded {
    static_assert(std::is_same_v<Gather, prefetch_next_layer> || std::is_same_v<Gather, gather_on_demand>,
                  "capscope::sharded<..., Gather>: the gather's timing is prefetch_next_layer or gather_on_demand");
    using gather_into = GatherInto;
    using on_pool_miss = OnPoolMiss;
    using backward = Backward;
    using gather = Gather;
};

namespace detail {
//! The policy as the Megatron-FSDP flags it stands for, on `Config`: the table's rules F1 and F2
//! decide, as they do for a Megatron command line.
template <class Config, class Policy>
constexpr runtime_config as_fsdp_flags() {
    runtime_config c = Config::normalized;
    c.fsdp.mode = fsdp_mode::v1;
    c.fsdp.double_buffer = std::is_same_v<typename Policy::gather_into, static_double_buffer>;                // --fsdp-double-buffer
    c.fsdp.persistent_buffer_on_alloc_fail = std::is_same_v<typename Policy::on_pool_miss, persistent_buffer>; // --fsdp-db-use-persist-buf-on-alloc-fail
    return c;
}

template <class Config, class Policy>
struct checked_sharding {
    static constexpr runtime_config flags = as_fsdp_flags<Config, Policy>();
    static_assert(!rules::F1::info.fires(flags),
                  "capscope rule F1: per-layer CUDA graphs with sharded data parallelism need static gather buffers "
                  "(otherwise parameter buffer addresses change between iterations and replay reads stale memory) -- fix: "
                  "use sharded<static_double_buffer, ...> (Megatron: --fsdp-double-buffer)");
    static_assert(!rules::F2::info.fires(flags),
                  "capscope rule F2: per-layer CUDA graphs with sharded data parallelism need a persistent buffer when a "
                  "gather misses the double-buffer pool (a dynamic one is an illegal memory access on replay) -- fix: use "
                  "sharded<static_double_buffer, persistent_buffer> (Megatron: --fsdp-db-use-persist-buf-on-alloc-fail)");
    static constexpr bool value = true;
};
} // namespace detail

//! Whether sharding policy `Policy` fits `Config` (F1, F2 at compile time).
template <class Config, class Policy>
inline constexpr bool sharding_fits = detail::checked_sharding<Config, Policy>::value;

//! One parameter's place in the shards: every rank owns `shard` elements of it, rank r from
//! element `r * shard` of the padded flat buffer (`padded` = ranks * shard >= count).
struct sharded_parameter {
    std::size_t count = 0;
    std::size_t padded = 0;
    std::size_t shard = 0;
    std::size_t offset_in_shard = 0; //!< where its shard starts in a rank's shard arena
    std::size_t offset_in_full = 0;  //!< where it starts in the gathered (full, padded) arena
};

struct shard_layout {
    int ranks = 1;
    std::vector<sharded_parameter> parameters;
    std::size_t shard_elements = 0; //!< a rank's arena: its shards of every parameter
    std::size_t full_elements = 0;  //!< the gathered arena: every parameter, padded

    //! Rank `rank`'s elements [first, first + count) of parameter `i`, in the parameter's own indexing
    //! (the padding tail excluded).
    std::pair<std::size_t, std::size_t> owned(std::size_t i, int rank) const {
        const sharded_parameter& p = parameters.at(i);
        const std::size_t first = std::size_t(rank) * p.shard;
        const std::size_t end = std::min(first + p.shard, p.count);
        return {std::min(first, p.count), end > first ? end - first : 0};
    }
};

//! Splits parameters of `counts` elements over `ranks` ranks; each shard is a multiple of
//! `alignment` elements (so every rank's piece starts aligned in both arenas).
inline shard_layout make_shard_layout(const std::vector<std::size_t>& counts, int ranks, std::size_t alignment = 64) {
    if (ranks < 1) throw std::invalid_argument("make_shard_layout: " + std::to_string(ranks) + " ranks; give 1 or more");
    if (alignment == 0) throw std::invalid_argument("make_shard_layout: alignment 0; give 1 or more elements");
    shard_layout l;
    l.ranks = ranks;
    for (std::size_t count : counts) {
        sharded_parameter p;
        p.count = count;
        const std::size_t per_rank = (count + std::size_t(ranks) - 1) / std::size_t(ranks);
        p.shard = (per_rank + alignment - 1) / alignment * alignment;
        p.padded = p.shard * std::size_t(ranks);
        p.offset_in_shard = l.shard_elements;
        p.offset_in_full = l.full_elements;
        l.shard_elements += p.shard;
        l.full_elements += p.padded;
        l.parameters.push_back(p);
    }
    return l;
}

} // namespace capscope
