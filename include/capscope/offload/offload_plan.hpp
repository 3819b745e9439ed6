#pragma once
//! @file
//! What activation offloading moves, and where every offloadable tensor lives (pure host).
//!
//! A trainer declares the tensors its layers keep for their backward, each named by the module
//! input it is (Megatron's `offload_modules` names, or its own). A *group* is one name of one layer (all
//! its tensors: `core_attn` is q, k, v and the attention probabilities). Under the policy
//! (`offload<...>`), a group moves to pinned host memory after its forward and comes back
//! before its backward. Its device bytes live in a *ring* of `slots` slots per module name, so
//! later layers reuse them instead of each layer holding its own:
//! - the tensors the policy offloads and that hold at least `min_offloaded_tensor_size`
//!   elements are eligible; the others keep memory of their own;
//! - the last `slots` eligible groups of each name stay on the device (no later group reuses
//!   their slot; Megatron likewise keeps the last group of each name), and so does a fraction
//!   of the rest: `offload_fraction` f leaves floor(n x (1 - f)) of those n groups on the
//!   device, the latest in forward order first (spec §4.5);
//! - a name's ring then holds its copied groups and the `slots` groups after them; group i of
//!   the ring uses slot i % slots, and its copies run on side lane `first_lane + slot`.

#include <capscope/plan/plan_error.hpp>
#include <capscope/stage/stage.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope {

//! A tensor a layer keeps for its backward, as a trainer declares it.
struct offload_tensor_decl {
    int layer = 0;
    offload_name module;
    std::string name;
    std::size_t bytes = 0;
    std::size_t element_bytes = 1;
};

//! The device ring: slots per module name, and the side lane of slot 0 (slot k uses lane
//! first_lane + k; lane 1 is left to the collectives of hooks).
struct offload_ring {
    int slots = 2;
    int first_lane = 2;
};

struct offload_group {
    int layer = 0;
    offload_name module;
    std::vector<int> tensors; //!< its eligible tensors (indices into offload_plan::tensors)
    std::size_t bytes = 0;    //!< theirs, each rounded up to offload_plan::alignment
    int member = -1;          //!< its position in its name's ring; -1 when it keeps memory of its own
    int slot = -1, lane = 0;  //!< member % slots, and that slot's side lane
    bool copied = false;      //!< moved to the host after its forward and back before its backward
    std::size_t host_offset = 0; //!< into the pinned host pool, when copied
};

//! Where a declared tensor's device bytes are: in the ring arena, or in the arena of tensors
//! with memory of their own.
struct offload_placement {
    bool in_ring = false;
    int group = -1; //!< its group, when eligible
    std::size_t offset = 0;
};

struct offload_plan {
    static constexpr std::size_t alignment = 256;
    offload_settings policy;
    offload_ring ring;
    std::vector<offload_tensor_decl> tensors;
    std::vector<offload_group> groups; //!< in forward order (layer, then declaration)
    std::vector<offload_placement> where; //!< per tensor
    std::size_t ring_bytes = 0, own_bytes = 0, host_bytes = 0;
    std::size_t bytes_without_offload = 0; //!< every declared tensor in memory of its own

    //! Moved out (and back) per microbatch: each copied group has a host region of its own.
    std::size_t copied_bytes() const { return host_bytes; }
    int copied_groups() const {
        int n = 0;
        for (const auto& g : groups) n += g.copied ? 1 : 0;
        return n;
    }
    //! Device bytes saved by the ring: every tensor on its own, less what the arenas take.
    std::size_t device_bytes_saved() const { return bytes_without_offload - (ring_bytes + own_bytes); }
    //! The group of `layer` and `module`, or -1.
    int group_of(int layer, offload_name module) const {
        for (std::size_t i = 0; i < groups.size(); ++i)
            if (groups[i].layer == layer && groups[i].module == module) return int(i);
        return -1;
    }
};

namespace detail {
constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
} // namespace detail

//! Decides what moves and lays out the memory. Throws `std::invalid_argument` on a declaration
//! or a ring that cannot work.
inline offload_plan plan_offload(const offload_settings& policy, std::vector<offload_tensor_decl> tensors, offload_ring ring = {}) {
    if (ring.slots < 1 || ring.first_lane < 1 || ring.first_lane + ring.slots - 1 > max_lanes)
        throw std::invalid_argument("capscope offload: a ring of " + std::to_string(ring.slots) + " slots from lane " +
                                    std::to_string(ring.first_lane) + " needs lanes " + std::to_string(ring.first_lane) + ".." +
                                    std::to_string(ring.first_lane + ring.slots - 1) + ", outside 1.." + std::to_string(max_lanes) +
                                    " -- fix: use 1 to " + std::to_string(max_lanes) + " slots from a lane that leaves room for them");
    // NaN fails both comparisons: it is refused too (a cast of it, or of a value past [0, 1], to a count is undefined).
    if (!(policy.fraction >= 0.0 && policy.fraction <= 1.0))
        throw std::invalid_argument("capscope offload: the offload fraction is " + std::to_string(policy.fraction) +
                                    ", outside [0, 1] -- fix: give the share of the eligible groups to copy out, from 0 (none) to 1 (all)");
    offload_plan plan;
    plan.policy = policy;
    plan.ring = ring;
    plan.tensors = std::move(tensors);
    const std::size_t a = offload_plan::alignment;
    for (const auto& t : plan.tensors) {
        if (t.module.empty())
            throw std::invalid_argument("capscope offload: tensor '" + t.name + "' of layer " + std::to_string(t.layer) +
                                        " has no offload name -- fix: name the module input it is (offload_module::core_attn, or a "
                                        "name of your own such as \"mixer_in\", offloaded with offload_tensors<\"mixer_in\">)");
        if (t.layer < 0 || t.bytes == 0 || t.element_bytes == 0)
            throw std::invalid_argument("capscope offload: tensor '" + t.name + "' is declared with layer " + std::to_string(t.layer) + ", " +
                                        std::to_string(t.bytes) + " bytes and element size " + std::to_string(t.element_bytes) +
                                        " -- fix: declare a layer's tensor (layer >= 0) with its size in bytes and the size of one element");
        plan.bytes_without_offload += detail::round_up(t.bytes, a);
    }
    plan.where.assign(plan.tensors.size(), {});

    // Groups: the eligible tensors of one layer and module input, in forward order.
    for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
        const auto& t = plan.tensors[i];
        const bool eligible = policy.enabled && policy.modules.contains(t.module) &&
                              (long long)(t.bytes / t.element_bytes) >= policy.min_tensor_size;
        if (!eligible) continue;
        int g = plan.group_of(t.layer, t.module);
        if (g < 0) {
            offload_group fresh;
            fresh.layer = t.layer;
            fresh.module = t.module;
            plan.groups.push_back(fresh);
            g = int(plan.groups.size()) - 1;
        }
        plan.groups[std::size_t(g)].tensors.push_back(int(i));
        plan.groups[std::size_t(g)].bytes += detail::round_up(t.bytes, a);
        plan.where[i].group = g;
    }
    std::stable_sort(plan.groups.begin(), plan.groups.end(), [](const auto& x, const auto& y) { return x.layer < y.layer; });
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        for (int t : plan.groups[g].tensors) plan.where[std::size_t(t)].group = int(g);

    // Each name's groups, in forward order; the names in the policy's order (Megatron's, then a trainer's own).
    std::vector<offload_name> names;
    policy.modules.for_each([&](offload_name n) { names.push_back(n); });
    std::vector<std::vector<int>> by_name(names.size());
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        by_name[std::size_t(std::find(names.begin(), names.end(), plan.groups[g].module) - names.begin())].push_back(int(g));

    // Candidates: every group of a name but its last `slots`; the fraction leaves the latest on the device.
    const int k = ring.slots;
    std::vector<int> candidates;
    for (const auto& of_name : by_name)
        for (int i = 0; i + k < int(of_name.size()); ++i) candidates.push_back(of_name[std::size_t(i)]);
    std::sort(candidates.begin(), candidates.end()); // forward order
    const auto disabled = std::size_t(std::floor(double(candidates.size()) * (1.0 - policy.fraction) + 1e-9));
    candidates.resize(candidates.size() - std::min(disabled, candidates.size()));
    for (int g : candidates) plan.groups[std::size_t(g)].copied = true;

    // Rings: each name's copied groups and the `slots` groups after them.
    for (const auto& of_name : by_name) {
        int copied = 0;
        for (int g : of_name) copied += plan.groups[std::size_t(g)].copied ? 1 : 0;
        if (copied == 0) continue;
        const int members = std::min(int(of_name.size()), copied + k);
        std::size_t slot_bytes = 0;
        for (int i = 0; i < members; ++i) slot_bytes = std::max(slot_bytes, plan.groups[std::size_t(of_name[std::size_t(i)])].bytes);
        const std::size_t base = plan.ring_bytes;
        for (int i = 0; i < members; ++i) {
            offload_group& g = plan.groups[std::size_t(of_name[std::size_t(i)])];
            g.member = i;
            g.slot = i % k;
            g.lane = ring.first_lane + g.slot;
            std::size_t offset = base + std::size_t(g.slot) * slot_bytes;
            for (int t : g.tensors) {
                plan.where[std::size_t(t)].in_ring = true;
                plan.where[std::size_t(t)].offset = offset;
                offset += detail::round_up(plan.tensors[std::size_t(t)].bytes, a);
            }
            if (g.copied) {
                g.host_offset = plan.host_bytes;
                plan.host_bytes += g.bytes;
            }
        }
        plan.ring_bytes += std::size_t(std::min(k, members)) * slot_bytes;
    }
    // Everything else has memory of its own.
    for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
        if (plan.where[i].in_ring) continue;
        plan.where[i].offset = plan.own_bytes;
        plan.own_bytes += detail::round_up(plan.tensors[i].bytes, a);
    }
    return plan;
}

//! Refuses a policy that is on but moves nothing, saying why: no tensor of its modules reaches
//! `min_offloaded_tensor_size`, or the groups that do all stay on the device (the last `slots` of
//! each module, and what the fraction leaves). Nothing would be saved, silently.
inline void require_moves_something(const offload_plan& plan) {
    const offload_settings& p = plan.policy;
    if (!p.enabled || plan.copied_groups() > 0) return;
    int offloaded = 0, eligible = 0;
    for (const auto& t : plan.tensors) {
        if (!p.modules.contains(t.module)) continue;
        ++offloaded;
        eligible += (long long)(t.bytes / t.element_bytes) >= p.min_tensor_size;
    }
    const std::string modules = detail::names_of(p.modules);
    if (offloaded == 0)
        throw std::invalid_argument("capscope offload: the policy offloads " + modules + ", but no layer declared a tensor of those "
                                    "module inputs, so nothing moves -- fix: declare the tensors the layers keep, or offload the "
                                    "modules they declare");
    if (eligible == 0)
        throw std::invalid_argument("capscope offload: the policy offloads " + modules + ", but all " + std::to_string(offloaded) +
                                    " of their tensors hold fewer than min_offloaded_tensor_size (" + std::to_string(p.min_tensor_size) +
                                    " elements), so nothing moves -- fix: lower min_offloaded_tensor_size<N> below their size, or "
                                    "turn offloading off");
    throw std::invalid_argument("capscope offload: the policy offloads " + modules + ", but every eligible group stays on the device (the "
                                "last " + std::to_string(plan.ring.slots) + " of each module keep their slots, and fraction " +
                                std::to_string(p.fraction) + " leaves the rest), so nothing moves -- fix: raise the fraction, use "
                                "fewer slots, or turn offloading off");
}

} // namespace capscope
