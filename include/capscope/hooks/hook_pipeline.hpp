#pragma once
//! @file
//! Hooks composed by type: `hook_pipeline` holds them in declaration order, and runs the ones of
//! one phase and placement, in that order, at a site of a layer (the whole layer, or one capture
//! region of it). Nothing is looked up by name and nothing is allocated: the selection is made at
//! compile time, and the loop over the hooks is unrolled.

#include <capscope/hooks/hook.hpp>
#include <capscope/stage/program.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace capscope {

namespace detail {
template <class H>
inline constexpr bool is_layer_hook = false;
template <hook_phase P, class Pl, class F, class... O>
inline constexpr bool is_layer_hook<layer_hook<P, Pl, F, O...>> = true;
template <class H>
inline constexpr bool is_warmup_hook = false;
template <warmup_point W, class F>
inline constexpr bool is_warmup_hook<warmup_hook<W, F>> = true;
template <class H>
inline constexpr bool is_step_hook = false;
template <step_point W, class Pl, class F, class... O>
inline constexpr bool is_step_hook<step_hook<W, Pl, F, O...>> = true;
template <class H>
constexpr bool is_boundary_step_hook() {
    if constexpr (is_step_hook<std::remove_cv_t<H>>) return std::is_same_v<typename H::placement, boundary>;
    else return false;
}
template <class H>
inline constexpr bool is_hook = is_layer_hook<H> || is_warmup_hook<H> || is_step_hook<H>;
} // namespace detail

template <class H>
concept any_hook = detail::is_hook<std::remove_cv_t<H>>;

namespace detail {
//! Whether hook H has phase P and placement Placement.
template <class H, hook_phase P, class Placement>
constexpr bool selects() {
    if constexpr (is_layer_hook<std::remove_cv_t<H>>) return H::phase == P && std::is_same_v<typename H::placement, Placement>;
    else return false;
}
} // namespace detail

//! Where along a layer hooks run: the layer itself (`whole_layer`), or the stages of one region.
struct hook_site {
    region_set region; //!< empty: the layer's own boundary
    static hook_site whole_layer() { return {}; }
};

template <class... Hooks>
class hook_pipeline {
    static_assert((detail::is_hook<std::remove_cv_t<Hooks>> && ...),
                  "capscope hook rule H0: hook_pipeline<...> holds hooks made by capscope::hook<phase, placement>(name, fn), "
                  "capscope::on_step<point, placement>(name, fn) or capscope::on_warmup<point>(name, fn) -- fix: wrap the "
                  "callable with one of them");

public:
    // With no hooks the second is the default constructor, so the first stands back.
    constexpr hook_pipeline()
        requires(sizeof...(Hooks) > 0)
    = default;
    constexpr explicit hook_pipeline(Hooks... hooks) : hooks_(std::move(hooks)...) {}

    static constexpr std::size_t size = sizeof...(Hooks);

    //! How many hooks have this phase and placement.
    template <hook_phase P, class Placement>
    static constexpr int count = (0 + ... + int(detail::selects<Hooks, P, Placement>()));
    //! Whether some hook is a boundary hook (host work around replays), of a layer or of the step.
    static constexpr bool has_boundary_hooks =
        (count<hook_phase::forward_pre, boundary> + count<hook_phase::forward, boundary> +
         count<hook_phase::backward_pre, boundary> + count<hook_phase::backward, boundary> +
         (0 + ... + int(detail::is_boundary_step_hook<Hooks>()))) > 0;

    //! The I-th hook, in declaration order.
    template <std::size_t I>
    constexpr const auto& at() const noexcept {
        return std::get<I>(hooks_);
    }
    using hook_types = std::tuple<Hooks...>;

    //! Runs the hooks of phase P and this placement that belong to `site`, in declaration order.
    template <hook_phase P, class Placement>
    void run(hook_context<P>& context, const hook_site& site = {}) const {
        std::apply([&](const Hooks&... h) { (run_one<P, Placement>(h, context, site), ...); }, hooks_);
    }
    //! Runs the warmup hooks of point W, in declaration order.
    template <warmup_point W>
    void run_warmup(warmup_context& context) const {
        std::apply(
            [&](const Hooks&... h) {
                (
                    [&] {
                        if constexpr (detail::is_warmup_hook<std::remove_cv_t<Hooks>>)
                            if constexpr (Hooks::when == W) h(context);
                    }(),
                    ...);
            },
            hooks_);
    }
    //! Calls `f(name, phase, placement name, regions)` for every layer hook, in declaration order (the plan's view).
    template <class F>
    void describe(F&& f) const {
        std::apply(
            [&](const Hooks&... h) {
                (
                    [&] {
                        if constexpr (detail::is_layer_hook<std::remove_cv_t<Hooks>>)
                            f(h.name(), Hooks::phase, placement_name<typename Hooks::placement>(), Hooks::regions);
                    }(),
                    ...);
            },
            hooks_);
    }

private:
    template <hook_phase P, class Placement, class H>
    static void run_one(const H& h, hook_context<P>& context, const hook_site& site) {
        if constexpr (detail::selects<H, P, Placement>()) {
            const bool here = H::regions.empty() ? site.region.empty() : H::regions.intersects(site.region);
            if (here) h(context);
        }
    }
    template <class Placement>
    static constexpr std::string_view placement_name() {
        if constexpr (std::is_same_v<Placement, capturable>) return "capturable";
        else if constexpr (std::is_same_v<Placement, boundary>) return "boundary";
        else return "capture_time";
    }

    std::tuple<Hooks...> hooks_;
};

template <class... Hooks>
hook_pipeline(Hooks...) -> hook_pipeline<Hooks...>;

//! The pipeline's warmup hooks as a program's warmup work (type-erased, no allocation): what
//! `with_hooks` puts in the program and `runner::set_warmup_hooks` sets. `hooks` must outlive it.
template <class... Hooks>
warmup_work warmup_work_of(const hook_pipeline<Hooks...>& hooks) noexcept {
    return {&hooks, [](const void* p, bool before, stream_handle stream) {
                warmup_context context{stream};
                const auto& pipeline = *static_cast<const hook_pipeline<Hooks...>*>(p);
                if (before) pipeline.template run_warmup<warmup_point::before>(context);
                else pipeline.template run_warmup<warmup_point::after>(context);
            }};
}

} // namespace capscope
