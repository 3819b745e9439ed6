#pragma once
//! @file
//! `in_place_runner<Config>`: capture scopes marked where a trainer's code stands. The trainer
//! keeps its own forward and backward functions, with their layer loops, and wraps each piece of
//! work it wants planned in a mark (capscope/stage/marked_region.hpp):
//!
//!     capscope::in_place_runner<my_config> cap;
//!     for (int it = 0; it < steps; ++it) {
//!         capscope::in_place_step step = cap.step(stream);
//!         step.run({.kind = stage_kind_id("zero_grads"), ...}, [&](cudaStream_t s) { zero_grads(s); });
//!         for (int mb = 0; mb < microbatches; ++mb) {
//!             step.microbatch();
//!             forward(model, mb, step);  // its loop marks step.forward({.layer = l, ...}, [&](cudaStream_t s) { ... })
//!             backward(model, mb, step); // and step.backward(...), layers in reverse
//!         }
//!         step.run({.kind = stage_kind::optimizer, ...}, [&](cudaStream_t s) { update(s); });
//!         step.end();
//!     }
//!
//! The first step records the marks (program_recorder) and runs each region's code as it comes;
//! at its end the recorded program is checked and planned as a declared one is (rules, plan,
//! derived stream order, verifier, layer schemas). From then on each region's code runs where the
//! plan says eager, and is captured or replayed where it says graph: when the trainer's code
//! reaches the first region of a graph, the graph is launched (captured the first time, and
//! launched when the code leaves its last region), and the graph's regions' code is not run. A
//! graph that holds a region marked `updated_in_graph` is launched when the code leaves its last
//! region: that region is recorded again as the code reaches it, with the step's values, and put
//! in place first. capscope's own calls (hooks) run in the plan's order: those in a region's
//! segment right after it, the others just before the next region (or at `end()`). A step whose
//! regions differ from the recorded ones (another order, another region, buffers at other
//! addresses) is an error naming the first difference, before that region's code runs (inside a
//! graph already launched: the error says the graph ran); `record_again()` records the next step.
//!
//! The trainer's code between two regions runs every step, in order. Host work there is fine.
//! CUDA work there is fine between graphs, but not between two regions one graph holds: it would
//! be captured with them and then run again after the graph. The capture doctor names it in the
//! last warmup step (P20), and a capture that finds new work on the step's stream between two of
//! its regions fails, naming them.
//!
//! A composition (hooks, offload: capscope/compose/composition.hpp) applies to the recorded
//! program through `composer`. Its work cannot run in a step that is being recorded, so such a
//! runner records in a pass of its own first (`record(body)`), in which the regions' code is not
//! run. Impl `transformer_engine` captures each graph when the first step after the warmup
//! reaches it, in schedule order, as `local` does: nothing of a region exists before its code runs.
//! A step the device may refuse (`training_program::rerun`) cannot be run again in place.

#include <capscope/run/in_place_core.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace capscope {

//! One step of an in_place_runner: what the trainer's code marks its regions on. Ends with
//! `end()`; a step left by an exception is abandoned (a capture in progress ended) when it goes.
class in_place_step {
public:
    in_place_step(in_place_step&& o) noexcept : core_(std::exchange(o.core_, nullptr)), generation_(o.generation_) {}
    in_place_step(const in_place_step&) = delete;
    in_place_step& operator=(const in_place_step&) = delete;
    in_place_step& operator=(in_place_step&&) = delete;
    ~in_place_step() {
        if (core_ && core_->generation() == generation_) core_->abandon();
    }

    //! Step-level work: before the first microbatch (`step_begin`: zeroing the gradients), or after
    //! the last (`step_end`: the optimizer). Forward only.
    template <class F>
        requires std::is_invocable_v<F&, cudaStream_t>
    void run(const marked_region& m, F&& fn) {
        core().arrive(true, phase::forward, m, fn);
    }
    //! The next microbatch begins: its forward marks, then its backward marks.
    void microbatch() { core().begin_microbatch(); }
    //! A region of the current microbatch's forward, and of its backward (layers in reverse).
    template <class F>
        requires std::is_invocable_v<F&, cudaStream_t>
    void forward(const marked_region& m, F&& fn) {
        core().arrive(false, phase::forward, m, fn);
    }
    template <class F>
        requires std::is_invocable_v<F&, cudaStream_t>
    void backward(const marked_region& m, F&& fn) {
        core().arrive(false, phase::backward, m, fn);
    }
    //! Ends the step: capscope's calls after the last region, the lanes joined into the step's
    //! stream. Throws when a recorded region was not reached.
    void end() {
        detail::in_place_core& c = core();
        core_ = nullptr;
        try {
            c.end();
        } catch (...) {
            c.abandon(); // a capture or a watch left open would outlive the step
            throw;
        }
    }

private:
    template <class C, class S>
    friend class in_place_runner;
    friend class detail::in_place_core;
    explicit in_place_step(detail::in_place_core& core) noexcept : core_(&core), generation_(core.generation()) {}
    detail::in_place_core& core() {
        if (!core_) throw std::logic_error("capscope: this in_place_step has ended -- fix: begin the next step with in_place_runner::step(stream)");
        if (core_->generation() != generation_)
            throw std::logic_error("capscope: this in_place_step belongs to an earlier step (a later step() began) -- fix: mark the regions "
                                   "on the step that step() returned last");
        return *core_;
    }
    detail::in_place_core* core_;
    unsigned long generation_;
};

template <class Config, class Schemas = layer_schemas<>>
class in_place_runner;

template <class Config, class... Layers>
class in_place_runner<Config, layer_schemas<Layers...>> {
    // Naming the layer kinds' plans checks them at compile time (rules P1, P2, P8, P9).
    static_assert(sizeof(layer_plans<Config, Layers...>) > 0);

public:
    using config_type = Config;
    using composer = detail::in_place_core::composer;

    //! `layers` and `outside_layers`: what the layers' stages touch besides their marks' buffers
    //! (training_program::layers). `compose`: applied to the recorded program (hooks, offload);
    //! with one, `record(body)` comes first.
    explicit in_place_runner(std::vector<layer_buffers> layers = {}, layer_buffers outside_layers = {}, composer compose = {})
        : core_(std::make_unique<detail::in_place_core>(settings(), std::move(layers), std::move(outside_layers), std::move(compose))) {}

    //! Begins a step on `s` (the trainer's own stream: its code may keep using it as a global).
    [[nodiscard]] in_place_step step(cudaStream_t s) {
        core_->begin(s);
        return in_place_step(*core_);
    }
    //! Records one step's marks without running their code: `body(step)` makes them (the trainer's
    //! step, its regions' callables not called; its code between them runs). `record` ends the
    //! step itself: `body` does not call `end()`.
    template <class Body>
        requires std::is_invocable_v<Body&, in_place_step&>
    void record(Body&& body) {
        core_->record(body);
    }
    //! The next step is recorded anew; every graph is freed.
    void record_again() noexcept { core_->record_again(); }

    bool recorded() const noexcept { return core_->recorded(); }
    const training_plan& plan() const { return core_->plan(); }
    const training_program& program() const { return core_->program(); }
    //! The plan's text, as a runner's; under transformer_engine it says when in place captures.
    std::string plan_text() const {
        std::string text = to_text(core_->plan(), core_->program());
        constexpr std::string_view ahead = "all captured ahead of time in the order g0, g1, ...";
        if (const std::size_t at = text.find(ahead); at != std::string::npos)
            text.replace(at, ahead.size(), "captured in the order g0, g1, ... as the first step after the warmup reaches them (in place, "
                                           "nothing of a region exists before its code runs)");
        return text;
    }
    std::string plan_dot() const { return to_dot(core_->plan(), core_->program()); }
    void verify() const { verify_stream_order(core_->plan(), core_->program()); }
    const runner_counters& counters() const noexcept { return core_->counters(); }
    const std::string& last_failure() const noexcept { return core_->last_failure(); }
    int graphs_alive() const { return core_->graphs_alive(); }
    int graphs_run_eagerly() const { return core_->graphs_run_eagerly(); }

private:
    static detail::in_place_settings settings() {
        return {capture_scope_of<Config>, Config::warmup_steps, Config::engine.mode, Config::engine.on_failure, Config::engine.capture_doctor,
                &detail::check_program_for<Config, Layers...>};
    }
    std::unique_ptr<detail::in_place_core> core_; //!< on the heap: a step points to it, and the runner moves
};

template <class Body>
void detail::in_place_core::record(Body&& body) {
    if (in_step_) abandon();
    record_again();
    recording_ = true;
    dry_ = true;
    recorder_ = program_recorder{};
    in_step_ = true;
    ++generation_;
    microbatch_ = -1;
    previous_scratch_ = active_scratch;
    struct undry {
        bool& d;
        ~undry() { d = false; }
    } restore{dry_};
    in_place_step step(*this);
    body(step);
    step.end();
}

} // namespace capscope
