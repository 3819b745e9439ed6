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
//! Each part is kept as a type: naming one returns a new composition whose type holds it, so a
//! part named twice does not compile (composition rules C1-C3), and what the parts are is known
//! at compile time (the hooks' lanes among it). The parts may be named in any order: `program()`
//! composes them in one order (copies first, then hooks, which attach to the trainer's stages),
//! so the plan is the same whatever the order (and the plan checks every rule, P11 among them,
//! on the final program). The composition keeps what the stages point to:
//! its own copy of the pipeline and of the layers' buffers, owned by the program it makes
//! (`training_program::keepalive`), so nothing dangles when the caller's temporaries are gone.
//! The trainer keeps the activation store and the buffers themselves. The untyped steps
//! underneath are `with_hooks` (capscope/hooks/with_hooks.hpp) and `with_offload`
//! (capscope/offload/with_offload.hpp).

#include <capscope/config/config.hpp>
#include <capscope/hooks/hooks_fit.hpp>
#include <capscope/hooks/with_hooks.hpp>
#include <capscope/parallel/sharding.hpp>
#include <capscope/plan/layer_plan.hpp>

#include <concepts>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace capscope {

namespace detail {
//! A part the composition has not been given.
struct part_not_named {};

//! The side lane a hook runs on (0: the step's stream; warmup hooks name none).
template <class Hook>
constexpr int lane_of_hook() {
    if constexpr (requires { Hook::lane; }) return Hook::lane;
    else return 0;
}

//! The hooks part: the composition's own copy of the pipeline and of the layers' buffers, shared
//! with the program it makes (the stages point into it).
template <class... Hooks>
struct held_hooks {
    held_hooks(hook_pipeline<Hooks...> p, std::vector<layer_buffers> l) : pipeline(std::move(p)), buffers(std::move(l)) {
        tensors.reserve(buffers.size());
        for (const layer_buffers& b : buffers) tensors.push_back(view_of(b));
    }
    held_hooks(const held_hooks&) = delete; // the stages point into it
    hook_pipeline<Hooks...> pipeline;
    std::vector<layer_buffers> buffers;
    std::vector<layer_tensors> tensors; //!< spans into `buffers`
    //! The side lanes the hooks run on, known from their types (0 for the step's stream).
    static constexpr int lanes[] = {0, lane_of_hook<Hooks>()...};
};
template <class... Hooks>
struct composed_hooks {
    std::shared_ptr<held_hooks<Hooks...>> held;
};
//! The offload part: the trainer's activation store (which the trainer keeps alive).
template <class Store>
struct composed_offload {
    const Store* store;
};
template <class Policy>
struct composed_sharding {};

template <class Part>
inline constexpr bool is_named = !std::is_same_v<Part, part_not_named>;
} // namespace detail

template <class Config, class Hooks = detail::part_not_named, class Offload = detail::part_not_named, class Sharding = detail::part_not_named>
class composition {
    template <class, class, class, class>
    friend class composition;

public:
    explicit composition(training_program program) : program_(std::move(program)) {}

    //! The hooks of `pipeline` (copied), on layers 0..layers.size()-1 with these parameters and
    //! gradients (copied): rule H2 is checked against `Config` here.
    template <class... H>
    [[nodiscard("a part is kept in the composition the call returns: chain the parts")]] composition<Config, detail::composed_hooks<H...>, Offload, Sharding> hooks(hook_pipeline<H...> pipeline, std::vector<layer_buffers> layers) const {
        static_assert(!detail::is_named<Hooks>, "capscope composition rule C1: a composition's hooks are named once, and these are the second "
                                                "-- fix: put every hook in one pipeline");
        static_assert(hooks_fit<Config, hook_pipeline<H...>>);
        return {program_, {std::make_shared<detail::held_hooks<H...>>(std::move(pipeline), std::move(layers))}, offload_};
    }

    //! Activation offload by `store` (an `activation_store`, which the trainer keeps alive), its
    //! copies placed for `Config`'s capture scope.
    template <class Store>
        requires requires(const Store& s, const training_program& p, const capture_scope& c) {
            { s.with_offload(p, c) } -> std::same_as<training_program>;
        }
    [[nodiscard("a part is kept in the composition the call returns: chain the parts")]] composition<Config, Hooks, detail::composed_offload<Store>, Sharding>
    offload(const Store& store) const {
        static_assert(!detail::is_named<Offload>, "capscope composition rule C2: a composition offloads through one activation store, and "
                                                  "this is the second -- fix: name one activation store");
        return {program_, hooks_, {&store}};
    }

    //! The composition keeps a pointer to the store: a temporary would dangle.
    template <class Store>
    void offload(const Store&&) const = delete;

    //! Sharded data parallelism under `Policy`: rules F1 and F2 are checked against `Config` here.
    //! (The gathers and reductions are hooks: name them with `hooks`.)
    template <class Policy>
    [[nodiscard("a part is kept in the composition the call returns: chain the parts")]] composition<Config, Hooks, Offload, detail::composed_sharding<Policy>>
    sharded() const {
        static_assert(!detail::is_named<Sharding>, "capscope composition rule C3: a composition has one sharding policy, and this is the "
                                                   "second -- fix: name one sharded<...>");
        static_assert(sharding_fits<Config, Policy>);
        return {program_, hooks_, offload_};
    }

    //! The composed program: copies first, then hooks (`with_hooks(with_offload(p))`).
    training_program program() const {
        training_program p = program_;
        if constexpr (detail::is_named<Offload>) {
            if constexpr (detail::is_named<Hooks>) refuse_shared_lanes();
            p = offload_.store->with_offload(p, capture_scope_of<Config>);
        }
        if constexpr (detail::is_named<Hooks>) {
            training_program out = with_hooks(p, hooks_.held->pipeline, hooks_.held->tensors, &capture_scope_of<Config>);
            out.keepalive.push_back(hooks_.held);
            return out;
        }
        return p;
    }

private:
    composition(training_program program, Hooks hooks, Offload offload)
        : program_(std::move(program)), hooks_(std::move(hooks)), offload_(offload) {}

    //! A hook and a copy on one lane would be ordered by that stream, not by what they touch: the
    //! copies would queue behind the hook's work (or the reverse), silently. The copies' lanes are
    //! read when the program is made: the store may be allocated after it is named.
    void refuse_shared_lanes() const {
        if constexpr (requires { offload_.store->plan().ring; }) {
            const auto& plan = offload_.store->plan();
            if (plan.copied_groups() == 0) return;
            const int first = plan.ring.first_lane, last = plan.ring.first_lane + plan.ring.slots - 1;
            for (int lane : std::remove_cvref_t<decltype(*hooks_.held)>::lanes)
                if (lane != 0 && lane >= first && lane <= last)
                    throw std::invalid_argument("capscope::composition: a hook runs on lane " + std::to_string(lane) +
                                                ", which the activation copies use (lanes " + std::to_string(first) + ".." + std::to_string(last) +
                                                ") -- fix: move the hook to another on_lane<K>, or the copies with offload_ring::first_lane");
        }
    }

    training_program program_;
    [[no_unique_address]] Hooks hooks_{};
    [[no_unique_address]] Offload offload_{};
};

} // namespace capscope
