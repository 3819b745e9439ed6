#pragma once
//! @file
//! `composition<Config>`: a trainer's program with its hooks, activation offload and sharding
//! policy, named in one place and checked against the config where they are named, with no
//! `static_assert` to remember:
//!
//!     auto program = composition<my_config>(model.training_program())
//!                        .hooks(pipeline, layer_buffers)  // H2 (hooks_fit) checked here
//!                        .sharded<sharded<>>()            // F1, F2 (sharding_fits) checked here
//!                        .offload(store)                  // an activation_store, placed for Config
//!                        .program();
//!     runner<my_config> r(std::move(program));
//!
//! Each part returns the composition, so they chain on a temporary as above (within one
//! expression). The parts may be named in any order: `program()` composes them in one order (copies first,
//! then hooks, which attach to the trainer's stages), so the plan is the same whatever the order. The composition keeps what the
//! stages point to: its own copy of the pipeline and of the layers' buffers, owned by the
//! program it makes (`training_program::keepalive`), so nothing dangles when the caller's
//! temporaries are gone. The trainer keeps the activation store and the buffers themselves.
//! `with_hooks` and `with_offload` stay the untyped steps underneath.

#include <capscope/config/config.hpp>
#include <capscope/hooks/hooks_fit.hpp>
#include <capscope/hooks/with_hooks.hpp>
#include <capscope/plan/layer_plan.hpp>
#include <capscope/parallel/sharding.hpp>

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

namespace capscope {

template <class Config>
class composition {
public:
    explicit composition(training_program program) : program_(std::move(program)) {}

    //! The hooks of `pipeline` (copied), on layers 0..layers.size()-1 with these parameters and
    //! gradients (copied): rule H2 is checked against `Config` here.
    template <class... Hooks>
    composition& hooks(hook_pipeline<Hooks...> pipeline, std::vector<layer_buffers> layers) {
        static_assert(hooks_fit<Config, hook_pipeline<Hooks...>>);
        if (hooks_) throw std::invalid_argument("capscope::composition: hooks named twice -- fix: put every hook in one pipeline");
        (
            [&] {
                if constexpr (requires { Hooks::lane; })
                    if (Hooks::lane != 0) hook_lanes_.push_back(Hooks::lane);
            }(),
            ...);
        auto held = std::make_shared<held_hooks<Hooks...>>(std::move(pipeline), std::move(layers));
        hooks_ = [held](const training_program& p) {
            training_program out = with_hooks(p, held->pipeline, held->tensors, &capture_scope_of<Config>);
            out.keepalive.push_back(held);
            return out;
        };
        return *this;
    }

    //! Activation offload by `store` (an `activation_store`, which the trainer keeps alive), its
    //! copies placed for `Config`'s capture scope.
    template <class Store>
        requires requires(const Store& s, const training_program& p, const capture_scope& c) {
            { s.with_offload(p, c) } -> std::same_as<training_program>;
        }
    composition& offload(const Store& store) {
        if (offload_) throw std::invalid_argument("capscope::composition: offload named twice -- fix: name one activation store");
        offload_ = [&store](const training_program& p) { return store.with_offload(p, capture_scope_of<Config>); };
        if constexpr (requires { store.plan().ring; })
            copy_lanes_ = [&store]() -> std::pair<int, int> { // read when the program is made: the store may be allocated later
                const auto& plan = store.plan();
                if (plan.copied_groups() == 0) return {1, 0};
                return {plan.ring.first_lane, plan.ring.first_lane + plan.ring.slots - 1};
            };
        return *this;
    }

    //! Sharded data parallelism under `Policy`: rules F1 and F2 are checked against `Config` here.
    //! (The gathers and reductions are hooks: name them with `hooks`.)
    template <class Policy>
    composition& sharded() {
        static_assert(sharding_fits<Config, Policy>);
        return *this;
    }

    //! The composed program: copies first, then hooks (`with_hooks(with_offload(p))`; the other
    //! order of the untyped steps differs only where a backward hook and a copy back share a place).
    training_program program() const {
        // A hook and a copy on one lane would be ordered by that stream, not by what they touch:
        // the copies would queue behind the hook's work (or the reverse), silently.
        const std::pair<int, int> copies = copy_lanes_ ? copy_lanes_() : std::pair<int, int>{1, 0};
        for (int lane : hook_lanes_)
            if (lane >= copies.first && lane <= copies.second)
                throw std::invalid_argument("capscope::composition: a hook runs on lane " + std::to_string(lane) + ", which the activation copies use (lanes " +
                                            std::to_string(copies.first) + ".." + std::to_string(copies.second) +
                                            ") -- fix: move the hook to another on_lane<K>, or the copies with offload_ring::first_lane");
        training_program p = program_;
        if (offload_) p = offload_(p);
        if (hooks_) p = hooks_(p);
        return p;
    }

private:
    template <class... Hooks>
    struct held_hooks {
        held_hooks(hook_pipeline<Hooks...> p, std::vector<layer_buffers> l) : pipeline(std::move(p)), buffers(std::move(l)) {
            tensors.reserve(buffers.size());
            for (const layer_buffers& b : buffers) tensors.push_back({b.parameters, b.gradients});
        }
        held_hooks(const held_hooks&) = delete; // the stages point into it
        hook_pipeline<Hooks...> pipeline;
        std::vector<layer_buffers> buffers;
        std::vector<layer_tensors> tensors; //!< spans into `buffers`
    };

    training_program program_;
    std::function<training_program(const training_program&)> hooks_, offload_;
    std::vector<int> hook_lanes_;                 //!< the side lanes the hooks run on
    std::function<std::pair<int, int>()> copy_lanes_; //!< the copies' lanes (none: an empty range)
};

} // namespace capscope
