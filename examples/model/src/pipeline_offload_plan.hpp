#pragma once
// The pipelined model's activation offload planned for every virtual stage, on every rank, before
// any chunk allocates (pipeline.cu's constructor): the policy is planned per chunk, so without this
// one rank could refuse its chunk while another went on and waited for it in a receive.

#include <gpt/pipeline.hpp>

#include "layers.hpp"

#include <capscope/offload/activation_store.hpp>
#include <capscope/offload/offload_plan.hpp>

#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpt::detail {
namespace pl = capscope::pipeline;

//! What one layer of each kind in the pattern ('D', 'E', 'M') keeps for its backward: the
//! activation store's declarations of a one-layer part, the first layer of that kind. Every layer
//! of a kind declares the same (declare_model gives each layer the same block shape); only its
//! index and name differ. A throwaway part: its parameters are declared only, never allocated;
//! its blocks' buffers and its kept tensors (the store allocated with offloading off, so every
//! tensor in memory of its own) are one layer's, freed on return, before any chunk allocates.
struct kept_by_one_layer {
    int layer = 0; //!< the layer that declared them
    std::vector<capscope::offload_tensor_decl> tensors;
};
template <class T>
std::map<char, kept_by_one_layer> kept_tensors_by_kind(const model_config& cfg, const capscope::cuda::blas_handle& blas) {
    std::map<char, kept_by_one_layer> by_kind;
    for (int layer = 0; layer < int(cfg.layer_pattern.size()); ++layer) {
        const char kind = cfg.layer_pattern[std::size_t(layer)];
        if (by_kind.contains(kind)) continue;
        parameter_store<T> params;
        capscope::activation_store store;
        backward_scratch scratch;
        const detail::model_layout<T> layout = detail::declare_model(cfg, /*training=*/true, params, blas, store, &scratch, nullptr, nullptr,
                                                                     detail::model_part{layer, layer + 1, false, false});
        store.allocate(capscope::offload_settings{}); // off: gives the declarations back, and moves nothing
        by_kind[kind] = {layer, store.plan().tensors};
    }
    return by_kind;
}

//! Layers `first` to `end - 1` as a message names them.
inline std::string layer_range(int first, int end) {
    return end - first == 1 ? "layer " + std::to_string(first) : "layers " + std::to_string(first) + "-" + std::to_string(end - 1);
}

//! The offload plan of every virtual stage of the pipeline, each as its chunk will plan it, on
//! whichever rank: the planner's dry run (plan_offload, require_moves_something) on the tensors
//! its layers declare. The policy is planned per chunk, so one rank's chunks may plan while
//! another's refuse; that rank would throw and this one would wait forever in its first receive.
//! Planning every stage on every rank makes them all refuse alike, with the same message (the
//! first refused stage's).
template <class T>
std::vector<capscope::offload_plan> plan_every_stage(const model_config& cfg, const pl::schedule_shape& shape, const activation_offload& offload,
                                                     const capscope::cuda::blas_handle& blas) {
    capscope::plan_offload(offload.policy, {}, offload.ring); // a ring or a fraction refused on every stage alike: the planner's own message
    const auto by_kind = kept_tensors_by_kind<T>(cfg, blas);
    const int per_chunk = shape.layers_per_chunk();
    std::vector<capscope::offload_plan> plans;
    for (int virtual_stage = 0; virtual_stage < shape.stages(); ++virtual_stage) {
        const int first = virtual_stage * per_chunk, end = first + per_chunk;
        std::vector<capscope::offload_tensor_decl> kept;
        for (int layer = first; layer < end; ++layer) {
            const kept_by_one_layer& like = by_kind.at(cfg.layer_pattern[std::size_t(layer)]);
            const std::string own = "layer" + std::to_string(layer), theirs = "layer" + std::to_string(like.layer);
            for (capscope::offload_tensor_decl d : like.tensors) {
                if (d.name.starts_with(theirs)) d.name = own + d.name.substr(theirs.size()); // (names only label; the plan reads the rest)
                d.layer = layer;
                kept.push_back(std::move(d));
            }
        }
        try {
            plans.push_back(capscope::plan_offload(offload.policy, std::move(kept), offload.ring));
            capscope::require_moves_something(plans.back());
        } catch (const std::invalid_argument& e) {
            std::string reason = e.what(), fix = "turn offloading off"; // (for a message without a fix of its own)
            if (const auto at = reason.find(" -- fix: "); at != std::string::npos) {
                fix = reason.substr(at + std::string_view(" -- fix: ").size());
                reason.resize(at);
            }
            if (constexpr std::string_view planner = "capscope offload: "; reason.starts_with(planner)) reason.erase(0, planner.size());
            const std::string slots = std::to_string(offload.ring.slots) + (offload.ring.slots == 1 ? " slot" : " slots");
            throw std::invalid_argument("gpt::pipeline_model: activation offload refuses virtual stage " + std::to_string(virtual_stage) + " (" +
                                        layer_range(first, end) + ", on rank " + std::to_string(shape.rank_of(virtual_stage)) + "): " + reason +
                                        " -- fix: " + fix + "; or give every virtual stage more layers that keep offloaded tensors than the "
                                        "ring's " + slots + " (each chunk is planned on its own): another layer_pattern, or fewer ranks x "
                                        "virtual_stages");
        }
    }
    return plans;
}
} // namespace gpt::detail
