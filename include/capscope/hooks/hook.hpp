#pragma once
//! @file
//! A hook: a callable, the phase it runs in, and where it runs, all in its type.
//!
//!     auto reduce = hook<hook_phase::backward, capturable>([&](backward_context& c) { all_reduce(c.gradients(), c.stream()); });
//!
//! Placements:
//! - `capturable`: only enqueues stream work (a kernel, a copy, an NCCL call); captured into the
//!   segment's graph at its position, and run at the same position when eager;
//! - `boundary`: host work around each replay of the segment that holds its layer, outside the graph;
//! - `capture_time`: runs once, while the segment is captured (Transformer Engine's capture_time_hooks).
//! The callable takes its phase's context (`backward_context&`, ...): the context decides what it
//! can touch, and a context of another phase is rule H1. A capturable hook may not declare a host
//! synchronization (H4).

#include <capscope/hooks/hook_context.hpp>
#include <capscope/stage/schema.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace capscope {

struct capturable {};
struct boundary {};
struct capture_time {};

template <class P>
concept hook_placement = std::same_as<P, capturable> || std::same_as<P, boundary> || std::same_as<P, capture_time>;

//! Hook option: the hook runs only in the step's last microbatch (a gradient reduction: earlier
//! microbatches accumulate locally). Its stage stays in every microbatch's list, so the lists stay
//! alike (plan rule P3); the plan calls it in the last microbatch only.
struct last_microbatch_only {};

//! Hook option: the hook runs only in the step's first microbatch (an all-gather into a buffer
//! that keeps what it gathered for the whole step: the later microbatches read the same values,
//! as nothing changes them before the optimizer). Its stage stays in every microbatch's list, as
//! with last_microbatch_only; the plan calls it in the first microbatch only.
struct first_microbatch_only {};

//! Hook option: a pre hook (forward_pre, backward_pre) that brings what its layer reads (an
//! all-gather of sharded parameters) runs one layer ahead, beside the layer before it in the
//! pass: layer L's forward_pre hook where layer L - 1's runs (the forward goes up the layers), its
//! backward_pre hook where layer L + 1's runs (the backward comes down); the pass's first layer
//! keeps its own, and gets the next layer's after it. On a lane (`on_lane<K>`), layer L + 1's
//! gather then overlaps layer L's work. The waits are derived as for any hook: layer L + 1 waits
//! for its gather, and the gather waits for the last reader of the buffer it overwrites (a double
//! buffer's other half), so the prefetch needs no wait of its own. What no wait can fix, a layer
//! gathering into the buffer the layer before it has yet to read, `with_hooks` refuses.
struct one_layer_ahead {};

//! Hook option `on_lane<K>` (capscope/stage/schema.hpp): the hook's stage runs on the runner's
//! side stream K, forked from the step's stream at the hook's position, so it overlaps the stages
//! after it (a gradient reduction beside the backward of earlier layers). The stages that touch
//! what it touches wait for it, as the plan derives (capscope/hooks/with_hooks.hpp).

//! Hook option: the hook belongs to one capture region of its layer (`of_region<capture::attention>`,
//! or a trainer's `region<"mixer">`), not the whole layer.
template <class Region>
struct of_region {
    static constexpr region_set regions = [] {
        region_set s;
        detail::add_region<Region>(s);
        return s;
    }();
};

//! Hook option: the hook runs on these layers only (`of_layers<0, 5>`); without it, on every
//! layer. A layer the program does not have is an error when the hooks are composed.
template <int... Layers>
struct of_layers {
    static_assert(sizeof...(Layers) > 0, "capscope hook rule H0: of_layers<...> names at least one layer -- fix: name the layers, or drop the option");
    static_assert(((Layers >= 0) && ...), "capscope hook rule H0: of_layers<...> names layers from 0 -- fix: use layer indices 0, 1, ...");
    static constexpr bool contains(int layer) { return ((layer == Layers) || ...); }
    static constexpr int last = [] {
        int m = 0;
        ((m = Layers > m ? Layers : m), ...);
        return m;
    }();
};

namespace detail {
//! The phase whose context F takes: the declared one first, so a generic lambda (`auto& c`) takes
//! the phase its declaration names, and the others are not tried (trying them would instantiate
//! its body with a context that lacks what it calls).
template <class F, hook_phase Declared>
constexpr int phase_taken() {
    if constexpr (std::is_invocable_v<const F&, hook_context<Declared>&>) return int(Declared);
    else if constexpr (std::is_invocable_v<const F&, forward_pre_context&>) return int(hook_phase::forward_pre);
    else if constexpr (std::is_invocable_v<const F&, forward_context&>) return int(hook_phase::forward);
    else if constexpr (std::is_invocable_v<const F&, backward_pre_context&>) return int(hook_phase::backward_pre);
    else if constexpr (std::is_invocable_v<const F&, backward_context&>) return int(hook_phase::backward);
    else return -1;
}
template <class O>
inline constexpr bool is_of_region = false;
template <class R>
inline constexpr bool is_of_region<of_region<R>> = true;
template <class O>
inline constexpr bool is_on_lane = false;
template <int K>
inline constexpr bool is_on_lane<on_lane<K>> = true;
template <class O>
inline constexpr bool is_of_layers = false;
template <class O>
inline constexpr bool is_ahead = std::is_same_v<O, one_layer_ahead>;
template <int... L>
inline constexpr bool is_of_layers<of_layers<L...>> = true;

//! The side stream a hook's options name (on_lane<K>), or 0.
template <class... Options>
constexpr int lane_of() {
    int k = 0;
    ([&] {
        if constexpr (is_on_lane<Options>) k = Options::lane;
    }(), ...);
    return k;
}

template <hook_phase Declared, class F>
struct checked_phase {
    static constexpr int taken = phase_taken<F, Declared>();
    static_assert(taken != -1,
                  "capscope hook rule H1: a hook's callable takes its phase's context by reference (forward_pre_context&, "
                  "forward_context&, backward_pre_context&, backward_context&) and this one takes none of them -- fix: "
                  "write the parameter as the declared phase's context type");
    static_assert(taken == -1 || taken == int(Declared) || taken != int(hook_phase::backward),
                  "capscope hook rule H1: this hook takes backward_context (the layer's gradients, complete only after its "
                  "backward) but is declared for another phase -- fix: declare it hook<hook_phase::backward, ...>");
    static_assert(taken == -1 || taken == int(Declared) || taken != int(hook_phase::backward_pre),
                  "capscope hook rule H1: this hook takes backward_pre_context but is declared for another phase -- fix: "
                  "declare it hook<hook_phase::backward_pre, ...>");
    static_assert(taken == -1 || taken == int(Declared) || taken != int(hook_phase::forward),
                  "capscope hook rule H1: this hook takes forward_context but is declared for another phase -- fix: "
                  "declare it hook<hook_phase::forward, ...>");
    static_assert(taken == -1 || taken == int(Declared) || taken != int(hook_phase::forward_pre),
                  "capscope hook rule H1: this hook takes forward_pre_context but is declared for another phase -- fix: "
                  "declare it hook<hook_phase::forward_pre, ...>");
    static constexpr bool checked = true;
};

template <class Placement, class... Options>
struct checked_placement {
    static_assert(hook_placement<Placement>,
                  "capscope hook rule H0: a hook's placement is capturable, boundary or capture_time -- fix: write "
                  "hook<phase, capturable>, hook<phase, boundary> or hook<phase, capture_time>");
    static_assert(!(std::same_as<Placement, capturable> && (std::same_as<Options, synchronizes_with_host> || ...)),
                  "capscope hook rule H4: a capturable hook is captured into the segment's graph, where a host "
                  "synchronization invalidates the capture (or would stall every replay) -- fix: declare it "
                  "hook<phase, boundary> (host work around each replay) or hook<phase, capture_time>");
    static_assert(((std::same_as<Options, synchronizes_with_host> || std::same_as<Options, last_microbatch_only> ||
                    std::same_as<Options, first_microbatch_only> || is_of_region<Options> || is_on_lane<Options> || is_of_layers<Options> ||
                    is_ahead<Options>) && ...),
                  "capscope hook rule H0: a hook's options are synchronizes_with_host, of_region<R>, of_layers<L...>, on_lane<K>, "
                  "one_layer_ahead, first_microbatch_only and last_microbatch_only -- fix: drop the other options");
    static_assert(!((std::same_as<Options, first_microbatch_only> || ...) && (std::same_as<Options, last_microbatch_only> || ...)),
                  "capscope hook rule H0: a hook runs in the step's first microbatch or in its last, and one that asked for both "
                  "would run only in steps of one microbatch -- fix: keep first_microbatch_only or last_microbatch_only");
    static_assert((int(is_of_layers<Options>) + ... + 0) <= 1, "capscope hook rule H0: a hook names its layers once -- fix: keep one of_layers<...>");
    static_assert((int(is_on_lane<Options>) + ... + 0) <= 1, "capscope hook rule H0: a hook runs on one lane -- fix: keep one on_lane<K>");
    static_assert(!std::same_as<Placement, boundary> || !(is_on_lane<Options> || ...),
                  "capscope hook rule H0: a boundary hook is host work on the step's stream, not on a lane -- fix: drop on_lane<K>, "
                  "or make the hook capturable");
    static constexpr bool checked = true;
};

//! one_layer_ahead: a pre hook of whole layers, stream work only, on every layer.
template <hook_phase Phase, class Placement, class... Options>
struct checked_ahead {
    static constexpr bool ahead = (is_ahead<Options> || ...);
    static_assert(!ahead || Phase == hook_phase::forward_pre || Phase == hook_phase::backward_pre,
                  "capscope hook rule H0: one_layer_ahead moves what a layer reads ahead of it, so it belongs to a forward_pre or "
                  "backward_pre hook (a forward or backward hook handles what the layer has just made) -- fix: drop "
                  "one_layer_ahead, or declare the hook hook_phase::forward_pre / hook_phase::backward_pre");
    static_assert(!ahead || std::same_as<Placement, capturable>,
                  "capscope hook rule H0: a one_layer_ahead hook prefetches with stream work (an all-gather), so it is capturable "
                  "-- fix: declare it hook<phase, capturable, one_layer_ahead, ...>");
    static_assert(!ahead || !((is_of_region<Options> || is_of_layers<Options>) || ...),
                  "capscope hook rule H0: a one_layer_ahead hook runs beside the whole layer before it, on every layer -- fix: "
                  "drop of_region<R> and of_layers<...>, or drop one_layer_ahead");
    static constexpr bool checked = true;
};
} // namespace detail

template <hook_phase Phase, class Placement, class F, class... Options>
class layer_hook {
    static_assert(detail::checked_placement<Placement, Options...>::checked);
    static_assert(detail::checked_ahead<Phase, Placement, Options...>::checked);
    static_assert(!requires { &F::collective_calls; } ||
                      requires(const F& f) { { f.collective_calls(0) } -> std::convertible_to<std::string>; },
                  "capscope hook rule H0: a hook's collective_calls, what the plan's fingerprint hashes besides its buffers, is "
                  "`std::string collective_calls(int layer) const` -- fix: give the member that signature");
    static_assert(detail::checked_phase<Phase, F>::checked);

public:
    static constexpr hook_phase phase = Phase;
    using placement = Placement;
    static constexpr bool synchronizes_host = (std::same_as<Options, synchronizes_with_host> || ...);
    static constexpr bool last_microbatch = (std::same_as<Options, last_microbatch_only> || ...);
    static constexpr bool first_microbatch = (std::same_as<Options, first_microbatch_only> || ...);
    //! Whether layer L's hook runs beside the layer before L in its pass (one_layer_ahead).
    static constexpr bool ahead = (detail::is_ahead<Options> || ...);
    //! The side stream it runs on; 0: that of the stages it hooks.
    static constexpr int lane = detail::lane_of<Options...>();
    //! Whether it runs on `layer` (of_layers<...>, or every layer).
    static constexpr bool on_layer([[maybe_unused]] int layer) {
        bool on = true;
        ([&] {
            if constexpr (detail::is_of_layers<Options>) on = Options::contains(layer);
        }(), ...);
        return on;
    }
    //! The largest layer it names, or -1 when it runs on every layer.
    static constexpr int last_named_layer = [] {
        int k = -1;
        ([&] {
            if constexpr (detail::is_of_layers<Options>) k = Options::last;
        }(), ...);
        return k;
    }();
    //! The regions it belongs to; empty = the whole layer.
    static constexpr region_set regions = [] {
        region_set s;
        ([&] {
            if constexpr (detail::is_of_region<Options>) s.insert_all(Options::regions);
        }(), ...);
        return s;
    }();

    constexpr layer_hook(std::string_view name, F fn) : name_(name), fn_(std::move(fn)) {}
    void operator()(hook_context<Phase>& context) const { fn_(context); }
    //! For the plan: "grad all-reduce".
    constexpr std::string_view name() const noexcept { return name_; }
    //! What decides the collective calls it makes on `layer` besides the buffers its stage
    //! declares, from its callable's `collective_calls(layer)` (a reduction's bucket size); empty
    //! when the callable has none. The plan's fingerprint covers it.
    std::string collective_calls([[maybe_unused]] int layer) const {
        if constexpr (requires(const F& f) { { f.collective_calls(layer) } -> std::convertible_to<std::string>; }) return fn_.collective_calls(layer);
        else return {};
    }

private:
    std::string_view name_;
    F fn_;
};

//! Declares a hook: `hook<hook_phase::backward, capturable>("grad all-reduce", [](backward_context& c) { ... })`.
//! The name is shown in the plan; it must outlive the hook (a literal).
template <hook_phase Phase, class Placement, class... Options, class F>
constexpr layer_hook<Phase, Placement, F, Options...> hook(std::string_view name, F fn) {
    return layer_hook<Phase, Placement, F, Options...>(name, std::move(fn));
}

//! Where in the step a step hook runs: after the last microbatch's backward (the loss and every
//! gradient complete) and before `step_end` (the optimizer), or after `step_end`.
enum class step_point : std::uint8_t { before_optimizer, after_optimizer };

constexpr std::string_view step_point_name(step_point p) { return p == step_point::before_optimizer ? "before_optimizer" : "after_optimizer"; }

namespace detail {
template <class Placement, class... Options>
struct checked_step_options {
    static_assert(hook_placement<Placement>,
                  "capscope hook rule H0: a step hook's placement is capturable, boundary or capture_time -- fix: write "
                  "on_step<point, capturable>, on_step<point, boundary> or on_step<point, capture_time>");
    static_assert(!(std::same_as<Placement, capturable> && (std::same_as<Options, synchronizes_with_host> || ...)),
                  "capscope hook rule H4: a capturable hook is captured into the segment's graph, where a host "
                  "synchronization invalidates the capture (or would stall every replay) -- fix: declare it "
                  "on_step<point, boundary> (host work between replays)");
    static_assert(((std::same_as<Options, synchronizes_with_host> || is_on_lane<Options>) && ...),
                  "capscope hook rule H0: a step hook's options are synchronizes_with_host and on_lane<K> (it runs once per "
                  "step, for every layer) -- fix: drop the other options");
    static_assert((int(is_on_lane<Options>) + ... + 0) <= 1, "capscope hook rule H0: a hook runs on one lane -- fix: keep one on_lane<K>");
    static_assert(!std::same_as<Placement, boundary> || !(is_on_lane<Options> || ...),
                  "capscope hook rule H0: a boundary hook is host work on the step's stream, not on a lane -- fix: drop on_lane<K>, "
                  "or make the hook capturable");
    static constexpr bool checked = true;
};
} // namespace detail

//! A hook of the step, not of a layer: at `When`, once per step, with every layer's parameters
//! and gradients (`step_context&`): gradient clipping, a loss or norm log, a whole-model
//! reduction. Its placement says where it runs, as a layer hook's does.
template <step_point When, class Placement, class F, class... Options>
class step_hook {
    static_assert(detail::checked_step_options<Placement, Options...>::checked);
    static_assert(std::is_invocable_v<const F&, step_context&>,
                  "capscope hook rule H1: a step hook's callable takes step_context& -- fix: write the parameter as step_context&");

public:
    static constexpr step_point when = When;
    using placement = Placement;
    static constexpr int lane = detail::lane_of<Options...>();

    constexpr step_hook(std::string_view name, F fn) : name_(name), fn_(std::move(fn)) {}
    void operator()(step_context& context) const { fn_(context); }
    constexpr std::string_view name() const noexcept { return name_; }

private:
    std::string_view name_;
    F fn_;
};

//! Declares a step hook: `on_step<step_point::before_optimizer, capturable>("clip", [](step_context& c) { ... })`.
template <step_point When, class Placement, class... Options, class F>
constexpr step_hook<When, Placement, F, Options...> on_step(std::string_view name, F fn) {
    return step_hook<When, Placement, F, Options...>(name, std::move(fn));
}

enum class warmup_point : std::uint8_t { before, after };

//! Runs once before, or once after, the eager warmup steps (`warmup_context&`).
template <warmup_point When, class F>
class warmup_hook {
    static_assert(std::is_invocable_v<const F&, warmup_context&>,
                  "capscope hook rule H1: a warmup hook's callable takes warmup_context& -- fix: write the parameter as warmup_context&");

public:
    static constexpr warmup_point when = When;
    constexpr warmup_hook(std::string_view name, F fn) : name_(name), fn_(std::move(fn)) {}
    void operator()(warmup_context& context) const { fn_(context); }
    constexpr std::string_view name() const noexcept { return name_; }

private:
    std::string_view name_;
    F fn_;
};

template <warmup_point When, class F>
constexpr warmup_hook<When, F> on_warmup(std::string_view name, F fn) {
    return warmup_hook<When, F>(name, std::move(fn));
}

} // namespace capscope
