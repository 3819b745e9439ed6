#pragma once
//! @file
//! `runner<Config>`: runs a `training_program` as the configuration says, one training step at
//! a time. Every impl shares one replay path: for each segment of the plan, one
//! `cudaGraphLaunch` or the eager island's own stage calls, with no allocation, no virtual call
//! and no lookup by name.
//!
//! - `none` (`impl::eager`): every stage eagerly.
//! - `local` (`impl::lazy_per_layer`): eager for the warmup steps; then each graphed segment is
//!   captured the first time it runs, and replayed after that.
//! - `transformer_engine` (`impl::ahead_of_time_per_layer`): eager for the warmup steps; then
//!   every graph is captured in schedule order before the step runs, and replayed.
//! - `full_iteration` (`impl::whole_iteration`): eager for the warmup steps; then the whole
//!   step (every microbatch's forward and backward, and the optimizer) is one graph.
//!
//! `runner<Config, layer_schemas<L...>>` also checks each layer kind's plan at compile time
//! (`layer_plan`) and, at construction, that the program's layers match those schemas.

#include <capscope/config/config.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/hooks/hook_pipeline.hpp>
#include <capscope/plan/layer_plan.hpp>
#include <capscope/plan/match_schemas.hpp>
#include <capscope/plan/model_facts.hpp>
#include <capscope/plan/print.hpp>
#include <capscope/plan/training_plan.hpp>
#include <capscope/run/capture_doctor.hpp>
#include <capscope/run/capture_failed.hpp>
#include <capscope/run/counters.hpp>
#include <capscope/run/segment_executor.hpp>

#include <cstdio>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capscope {

namespace detail {
//! The legacy default stream cannot be captured: a usage error, said before any capture.
inline void require_capturable_stream(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy)
        throw std::invalid_argument("capscope: the runner was given the legacy default stream (0), which cannot be captured, and its "
                                    "config captures graphs -- fix: give step() a stream of its own (capscope::cuda::stream, or "
                                    "cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))");
}

//! The calls of a plan, resolved against its program.
template <class Plan, class Program>
std::vector<bound_call> bind_calls(const Plan& plan, const Program& program) {
    std::vector<bound_call> calls;
    calls.reserve(plan.calls.size());
    for (const stage_call& c : plan.calls) {
        const stage& st = stage_of(program, c);
        std::span<const derived_wait> waits;
        if constexpr (requires { plan.waits_of(c.waits); }) waits = plan.waits_of(c.waits); // inference plans have no lanes
        calls.push_back({c.direction == phase::forward ? st.forward : st.backward, st.name, st.lane, waits, c.record, st.forks_to, st.capture_only,
                         // a test may break the guards on purpose: every guarded stage then runs once, unconditionally
                         st.guard && !installed_breakage().ignore_guards ? &st.guard : nullptr, &c, // c lives in the plan, as the waits do
                         !st.collective_calls.empty() || st.kind == stage_kind_id("collective"), st.updated_in_graph});
    }
    return calls;
}

//! Per segment of a plan, whether any of its calls makes collective calls; per graph, whether any
//! of its segments does. Around those, NCCL's rules without graph mixing are kept
//! (cuda/nccl_graph_mixing.hpp).
struct collective_segments {
    std::vector<unsigned char> segments, graphs;
};
inline std::vector<unsigned char> collective_segments_of(std::span<const plan_segment> segments, std::span<const bound_call> calls) {
    std::vector<unsigned char> c(segments.size(), 0);
    for (std::size_t i = 0; i < segments.size(); ++i)
        for (const bound_call& b : calls.subspan(std::size_t(segments[i].first_call), std::size_t(segments[i].call_count))) c[i] |= b.collective ? 1 : 0;
    return c;
}
inline collective_segments collectives_of(const training_plan& plan, std::span<const bound_call> calls) {
    collective_segments c{collective_segments_of(plan.segments, calls), std::vector<unsigned char>(std::size_t(plan.graph_count), 0)};
    for (std::size_t i = 0; i < plan.segments.size(); ++i)
        if (plan.segments[i].graphed) c.graphs[std::size_t(plan.segments[i].graph)] |= c.segments[i];
    return c;
}

//! What a training runner of `Config` checks of its program before planning it: the layer schemas
//! it names (`schema_mismatch`), the config's model facts (P10), a guarded optimizer (P17).
template <class Config, class... Layers>
void check_program_for(const training_program& p) {
    if constexpr (sizeof...(Layers) > 0) match_schemas(layer_schemas<Layers...>{}, p);
    if (!p.microbatches.empty()) check_model_facts(Config::normalized, p.microbatches.front());
    if constexpr (Config::normalized.nan_check_on_device) require_guarded_optimizer(p); // P17
}

//! The last warmup step's doctor, started (false, said on stderr, when CUPTI cannot be had).
inline bool start_doctor(std::unique_ptr<capture_doctor>& doctor, capture_mode mode) {
    doctor = std::make_unique<capture_doctor>(mode != capture_mode::relaxed);
    if (doctor->start()) return true;
    std::fprintf(stderr, "capscope: the capture doctor did not watch the last warmup step: %s; captures are not checked before they run\n",
                 doctor->unavailable().c_str());
    return false;
}

//! A training runner's graphs, per plan graph: the executable, the graph it was instantiated from
//! when calls in it are updated in the graph (their nodes are its nodes), those calls, and
//! whether a failure left it eager.
struct training_graphs {
    std::vector<cuda::graph_exec> execs;
    std::vector<cuda::graph> kept;
    std::vector<std::vector<updated_node>> updates;
    std::vector<unsigned char> run_eagerly;

    void resize(std::size_t n) {
        execs.clear();
        execs.resize(n);
        kept.clear();
        kept.resize(n);
        updates.assign(n, {});
        run_eagerly.assign(n, 0);
    }
    int alive() const {
        int n = 0;
        for (const auto& e : execs) n += e ? 1 : 0;
        return n;
    }
    int left_eager() const {
        int n = 0;
        for (auto f : run_eagerly) n += f;
        return n;
    }
    //! Frees every graph (the executables before the graphs they came from); true when any was alive.
    bool release() noexcept {
        const bool had = alive() > 0;
        for (cuda::graph_exec& e : execs) e = cuda::graph_exec{};
        for (cuda::graph& g : kept) g = cuda::graph{};
        for (auto& u : updates) u.clear();
        run_eagerly.assign(run_eagerly.size(), 0);
        return had;
    }
};

//! What an update the graph could not take comes to, for the message of either runner.
inline std::string update_refusal(const std::string& why) {
    return "': what it launches this step differs from what the graph holds in a way an update cannot take (another kernel, another "
           "number or order of launches; CUDA: " + why + ")";
}

//! Where a segment is, for a failed capture's message.
inline segment_site site_of(const training_plan& plan, const training_program& program, const plan_segment& seg) {
    return {"graph g" + std::to_string(seg.graph) + " (" + (seg.layer >= 0 ? "layer " + std::to_string(seg.layer) : std::string("outside the layers")) +
                (seg.microbatch >= 0 ? ", microbatch " + std::to_string(seg.microbatch) : std::string()) + ", " +
                std::string(phase_name(seg.direction)) + ": " + segment_stages(plan, program, seg, ", ") + ")",
            seg.layer, seg.graph, seg.microbatch};
}

//! Plan rule P20: what the doctor found, before the first capture. Under
//! `capture_failure::run_eagerly`, the graphs that hold those calls stay eager (counted as
//! capture failures) and nothing is thrown.
inline void act_on_findings(const capture_doctor& doctor, const training_plan& plan, std::span<const bound_call> calls,
                            std::vector<unsigned char>& run_eagerly, runner_counters& counters, capture_failure policy) {
    counters.doctor_calls_watched = doctor.calls_watched();
    const auto& found = doctor.findings();
    if (found.empty()) return;
    if (policy == capture_failure::run_eagerly) {
        for (const plan_segment& seg : plan.segments) {
            if (!seg.graphed || run_eagerly[std::size_t(seg.graph)]) continue;
            for (const bound_call& c : calls.subspan(std::size_t(seg.first_call), std::size_t(seg.call_count)))
                for (const void* refused : doctor.refused_calls())
                    if (c.call == refused && !run_eagerly[std::size_t(seg.graph)]) {
                        run_eagerly[std::size_t(seg.graph)] = 1;
                        count_one(counters.capture_failures);
                    }
        }
        return;
    }
    std::string what = "the capture doctor watched the last warmup step, and " + std::to_string(found.size()) +
                       (found.size() == 1 ? " call" : " calls") + " of stages that will be captured could not be: ";
    for (std::size_t i = 0; i < found.size() && i < 8; ++i) {
        const doctor_finding& f = found[i];
        what += (i ? "; " : "") + (f.between_regions ? "the code " + f.stage : "stage '" + f.stage + "'") + " " +
                (f.call == "(its return)" ? "" : "calls " + f.call + ": it ") + f.problem;
    }
    if (found.size() > 8) what += "; and " + std::to_string(found.size() - 8) + " more";
    throw plan_error("P20", found.front().stage, what,
                     found.front().fix + (found.front().between_regions ? " (or build the runner with " : " (or tag the stage so the plan keeps it out of graphs, or build the runner with ") +
                         "on_capture_failure<capture_failure::run_eagerly> to leave its graph eager; capture_doctor_off stops the watch)");
}
} // namespace detail

template <class Config, class Schemas = layer_schemas<>>
class runner;

template <class Config, class... Layers>
class runner<Config, layer_schemas<Layers...>> {
    // Naming the layer kinds' plans checks them at compile time (rules P1, P2, P8, P9).
    static_assert(sizeof(layer_plans<Config, Layers...>) > 0);

public:
    using config_type = Config;

    //! Plans the program (throws `plan_error`, or `schema_mismatch` when it does not match the
    //! declared schemas; P10 when the config's model facts are not the program's). Nothing is
    //! captured yet.
    explicit runner(training_program program)
        : program_(std::move(program)),
          plan_(make_training_plan(capture_scope_of<Config>, Config::warmup_steps, checked(program_))),
          calls_(detail::bind_calls(plan_, program_)),
          executor_(Config::engine.mode, Config::engine.on_failure) {
        graphs_.resize(std::size_t(plan_.graph_count));
        fresh_.assign(std::size_t(plan_.graph_count), {-1, -1});
        first_segment_.assign(std::size_t(plan_.graph_count), -1);
        for (std::size_t i = 0; i < plan_.segments.size(); ++i) {
            const plan_segment& s = plan_.segments[i];
            if (s.graphed && first_segment_[std::size_t(s.graph)] < 0) first_segment_[std::size_t(s.graph)] = int(i);
        }
        nccl_ = detail::collectives_of(plan_, calls_);
        if (detail::installed_breakage().skip_rerun) program_.rerun = {}; // a test, broken on purpose: a refused step stays refused
    }
    runner(runner&&) noexcept = default;
    // Members move in order: the old scratch arena is freed (cudaFree synchronizes) before the old
    // executable graphs are destroyed; they are never launched again.
    runner& operator=(runner&&) noexcept = default;
    ~runner() { release_graphs(); }

    //! One training step on `s`. A config that captures graphs needs a stream of its own: the
    //! legacy default stream cannot be captured, which is said at the first step. A step on
    //! another stream than the last waits for the last (an event recorded on that stream, so it
    //! must still exist when this step is enqueued).
    void step(cudaStream_t s) {
        ++step_serial_; // every call, finished or not: what `fresh_` compares
        if (plan_.graph_count > 0) detail::require_capturable_stream(s);
        executor_.follow_previous_step(s); // a step on another stream than the last waits for it
        if (!warmup_started_) {
            warmup_started_ = true;
            run_warmup_hooks(warmup_point::before, s);
            if (plan_.warmup_steps == 0) run_warmup_hooks(warmup_point::after, s);
        }
        scratch_scope scratch(executor_.scratch());
        lane_streams& lanes = executor_.lanes();
        executor_.prepare_events(plan_.events.size());
        const bool replaying = Config::impl != graph_impl::eager && warm_steps_ >= plan_.warmup_steps;
        if (replaying && Config::impl == graph_impl::ahead_of_time_per_layer && !captured_ahead_) capture_ahead_of_time(s);
        // The last eager warmup step, watched call by call (not the first: it does what libraries
        // do once, at their first use).
        const bool watched = Config::engine.capture_doctor && Config::impl != graph_impl::eager && plan_.warmup_steps >= 2 &&
                             warm_steps_ + 1 == plan_.warmup_steps && start_doctor();
        struct stop_watching {
            segment_executor& e;
            std::unique_ptr<detail::capture_doctor>& d;
            ~stop_watching() {
                e.watch_with(nullptr);
                if (d) d->stop();
            }
        } stop{executor_, doctor_};
        detail::capture_doctor* doctor = watched ? doctor_.get() : nullptr;
        for (const plan_segment& seg : plan_.segments) {
            // A segment on a side lane forks from the step's stream; the plan's waits come before it.
            const cudaStream_t on = seg.lane ? lanes.fork(seg.lane, s) : s;
            executor_.wait(plan_.waits_of(seg.waits), on);
            if (replaying && seg.graphed && !graphs_.run_eagerly[std::size_t(seg.graph)] &&
                (graphs_.execs[std::size_t(seg.graph)] || capture_in_step(seg, on)) && updated(seg)) {
                const cuda::graph_exec& exec = graphs_.execs[std::size_t(seg.graph)];
                if (nccl_.graphs[std::size_t(seg.graph)]) nccl_order_.launch(exec, on); // (NCCL's rules without graph mixing)
                else exec.launch(on);
                detail::count_one(executor_.counters().replays);
            } else {
                if (doctor) doctor->segment(seg.graphed && !graphs_.run_eagerly[std::size_t(seg.graph)]);
                if (nccl_.segments[std::size_t(&seg - plan_.segments.data())])
                    nccl_order_.eager(on, [&] { executor_.run_eagerly(calls_of(seg), on, seg.lane); });
                else executor_.run_eagerly(calls_of(seg), on, seg.lane);
            }
            executor_.record(seg.record, on);
        }
        executor_.wait(plan_.waits_of(plan_.end_waits), s); // every lane's last work, before step() returns
        executor_.watch_with(nullptr);
        if (program_.rerun && refused(s)) rerun_eagerly(s);
        detail::count_one(executor_.counters().steps);
        // Before the warmup ends: a refused runner stays in its last warmup step, so the next step()
        // is watched (and refused) again rather than captured.
        if (doctor) act_on(*doctor);
        if (warm_steps_ < plan_.warmup_steps && ++warm_steps_ == plan_.warmup_steps) run_warmup_hooks(warmup_point::after, s);
    }

    //! Warmup hooks (`on_warmup<warmup_point::before / after>`) run on the step's stream before
    //! the first warmup step and after the last one (both before the first step when there is no
    //! warmup), and again after `reset()`. Those of the pipeline `with_hooks` composed come with
    //! the program; this sets them for a program composed otherwise. The pipeline must outlive
    //! the runner.
    template <class... Hooks>
    void set_warmup_hooks(const hook_pipeline<Hooks...>& hooks) noexcept {
        program_.warmup = warmup_work_of(hooks);
    }
    //! The runner keeps a pointer to the pipeline: a temporary would dangle (`composition` owns a copy).
    template <class... Hooks>
    void set_warmup_hooks(hook_pipeline<Hooks...>&&) = delete;

    //! Frees every graph and returns to the state after construction: eager until the warmup
    //! steps have run again, then captured again. Counters are kept.
    void reset() {
        release_graphs();
        warm_steps_ = 0;
        warmup_started_ = false;
        captured_ahead_ = false;
    }

    const training_plan& plan() const noexcept { return plan_; }
    //! Proves the plan's stream order again (capscope/plan/verify.hpp; every plan is proven when
    //! made): throws `plan_error` P12 naming two calls that touch one buffer, one writing, with
    //! nothing ordering them.
    void verify() const { verify_stream_order(plan_, program_); }
    const training_program& program() const noexcept { return program_; }
    const runner_counters& counters() const noexcept { return executor_.counters(); }
    //! The last failure met while capturing, in words ("" if none); what was rethrown unchanged
    //! (out of memory, a trainer's own exception) is described here with its graph and stage.
    const std::string& last_failure() const noexcept { return executor_.last_failure(); }
    std::string plan_text() const { return to_text(plan_, program_); }
    std::string plan_dot() const { return to_dot(plan_, program_); }
    //! Executable graphs currently alive.
    int graphs_alive() const { return graphs_.alive(); }
    //! The runner's scratch memory (capscope/run/scratch.hpp): its pool, and the arena its graphs share.
    const scratch_pool& scratch() const noexcept { return executor_.scratch(); }
    //! Graphs that failed to capture and run eagerly (policy `capture_failure::run_eagerly`).
    int graphs_run_eagerly() const { return graphs_.left_eager(); }

private:
    static const training_program& checked(const training_program& p) {
        detail::check_program_for<Config, Layers...>(p);
        detail::require_safe_rerun(p, Config::normalized.static_expert_capacity); // P18
        return p;
    }

    std::span<const detail::bound_call> calls_of(const plan_segment& seg) const {
        return {calls_.data() + seg.first_call, std::size_t(seg.call_count)};
    }

    void capture_ahead_of_time(cudaStream_t s) {
        for (int g = 0; g < plan_.graph_count; ++g)
            if (!graphs_.execs[std::size_t(g)] && !graphs_.run_eagerly[std::size_t(g)]) {
                capture(plan_.segments[std::size_t(first_segment_[std::size_t(g)])], s);
                // Captured before this step's eager work ran: its updated calls are recorded again at their launch.
                fresh_[std::size_t(g)] = {-1, -1};
            }
        captured_ahead_ = true;
    }

    //! Captures and instantiates a segment's graph on `s`; false when a capture-rule failure
    //! leaves it eager (policy `run_eagerly`). Other failures propagate (segment_executor.hpp).
    bool capture(const plan_segment& seg, cudaStream_t s) {
        cuda::graph g = executor_.capture(calls_of(seg), s, seg.lane, [&] { return site(seg); });
        const std::size_t at = std::size_t(seg.graph);
        if (!g) {
            graphs_.run_eagerly[at] = 1;
            return false;
        }
        graphs_.updates[at] = executor_.take_captured_updates();
        g = executor_.launchable(std::move(g), !graphs_.updates[at].empty());
        executor_.apply(graphs_.execs[at], g, calls_[std::size_t(seg.first_call)].name);
        if (nccl_.graphs[at]) nccl_order_.captured();
        if (!graphs_.updates[at].empty()) graphs_.kept[at] = std::move(g); // its child nodes are updated through the graph instantiated
        fresh_[at] = {step_serial_, int(&seg - plan_.segments.data())};
        return true;
    }

    //! Before a replay of `seg`'s graph: its calls updated in the graph, recorded again with this
    //! step's values and put in place (not for the segment captured this very step: it holds them).
    //! False when the graph could not take them under capture_failure::run_eagerly: the segment
    //! then runs eagerly this step (counted); under raise, `capture_failed` names the stage.
    bool updated(const plan_segment& seg) {
        const std::size_t g = std::size_t(seg.graph);
        if (graphs_.updates[g].empty()) return true;
        if (fresh_[g].first == step_serial_ && fresh_[g].second == int(&seg - plan_.segments.data())) return true;
        std::string why;
        const std::string_view refused = executor_.refresh(graphs_.execs[g], graphs_.updates[g], calls_of(seg), why);
        if (refused.empty()) return true;
        if (Config::engine.on_failure == capture_failure::run_eagerly) {
            detail::count_one(executor_.counters().update_fallbacks);
            return false;
        }
        const segment_site where = site(seg);
        capture_failed failed("capscope: updating " + where.where + " before its replay failed at stage '" + std::string(refused) +
                                 detail::update_refusal(why) + "\n  fix: keep the stage's kernels and its number of launches the same every step (their arguments, grid "
                                 "and block sizes may change), or build the runner with on_capture_failure<capture_failure::run_eagerly>, "
                                 "under which such a step runs that segment eagerly (counted in update_fallbacks)",
                             std::string(refused), where.layer, where.graph, where.index);
        const int done = int(&seg - plan_.segments.data());
        failed.set_step_progress(done == 0 ? std::string("nothing of this step had run")
                                           : "this step stopped there: its first " + std::to_string(done) + " of " +
                                                 std::to_string(plan_.segments.size()) + " segments had run, the rest had not; restore the "
                                                 "model's state before another step");
        throw failed;
    }

    //! A lazy capture in the middle of a step: a failure says how much of the step had run.
    bool capture_in_step(const plan_segment& seg, cudaStream_t s) {
        try {
            return capture(seg, s);
        } catch (capture_failed& e) {
            const int done = int(&seg - plan_.segments.data());
            if (done == 0) {
                e.set_step_progress("nothing of this step had run: step() can be called again");
            } else {
                const plan_segment& last = plan_.segments[std::size_t(done - 1)];
                const std::string_view last_stage = calls_[std::size_t(last.first_call + last.call_count - 1)].name;
                e.set_step_progress("this step stopped there: its first " + std::to_string(done) + " of " +
                                    std::to_string(plan_.segments.size()) + " segments had run (through '" + std::string(last_stage) +
                                    "', " + std::string(phase_name(last.direction)) +
                                    "), the rest had not; restore the model's state before another step, or use impl "
                                    "transformer_engine, which captures every graph before a step runs");
            }
            throw;
        }
    }

    bool start_doctor() {
        if (!detail::start_doctor(doctor_, Config::engine.mode)) return false;
        executor_.watch_with(doctor_.get());
        return true;
    }

    void act_on(const detail::capture_doctor& doctor) {
        detail::act_on_findings(doctor, plan_, calls_, graphs_.run_eagerly, executor_.counters(), Config::engine.on_failure);
    }

    //! The rerun flag, read on the host once the step's work is done.
    bool refused(cudaStream_t s) {
        if (rerun_flag_.size() == 0) rerun_flag_ = cuda::pinned_buffer<int>(1); // at the first step: none on the replay path
        CAPSCOPE_CHECK(cudaMemcpyAsync(rerun_flag_.data(), program_.rerun.flag.data, sizeof(int), cudaMemcpyDeviceToHost, s));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
        return *rerun_flag_.data() != 0;
    }

    //! The refused step again, every call eagerly, between the program's `before` and `after`
    //! (`after` runs even when a call throws, so the stages are back on their captured path).
    void rerun_eagerly(cudaStream_t s) {
        detail::count_one(executor_.counters().reruns);
        lane_streams& lanes = executor_.lanes();
        struct after_guard {
            const step_rerun& r;
            cudaStream_t s;
            bool armed = true;
            ~after_guard() {
                if (!armed || !r.after) return;
                try {
                    r.after(s);
                } catch (...) { // a call threw already: that error is the one to report
                }
            }
        } after{program_.rerun, s};
        program_.rerun.before(s);
        for (const plan_segment& seg : plan_.segments) {
            const cudaStream_t on = seg.lane ? lanes.fork(seg.lane, s) : s;
            executor_.wait(plan_.waits_of(seg.waits), on);
            if (nccl_.segments[std::size_t(&seg - plan_.segments.data())])
                nccl_order_.eager(on, [&] { executor_.run_eagerly(calls_of(seg), on, seg.lane); });
            else executor_.run_eagerly(calls_of(seg), on, seg.lane);
            executor_.record(seg.record, on);
        }
        executor_.wait(plan_.waits_of(plan_.end_waits), s);
        after.armed = false;
        if (program_.rerun.after) program_.rerun.after(s);
        if (refused(s))
            throw std::runtime_error("capscope: the eager rerun of a refused step set the rerun flag '" + name_of(program_.rerun.flag) +
                                     "' again, so its weights were not updated -- fix: rerun.before must switch the stages to a path that cannot "
                                     "overflow (the example model: MoE layers sized by their counts)");
    }

    segment_site site(const plan_segment& seg) const { return detail::site_of(plan_, program_, seg); }

    void release_graphs() noexcept { executor_.release(graphs_.release()); }

    training_program program_;
    training_plan plan_;
    std::vector<detail::bound_call> calls_; //!< names and forks_to point into program_'s stages
    segment_executor executor_;
    detail::training_graphs graphs_;
    //! Per graph, the step and segment of its capture (whose updated calls hold that step's values).
    std::vector<std::pair<long, int>> fresh_;
    long step_serial_ = 0; //!< step() calls so far
    //! The last warmup step's (capscope/run/capture_doctor.hpp); kept, as a callback on another
    //! thread may still read it while CUPTI lets go; on the heap, so the runner moves.
    std::unique_ptr<detail::capture_doctor> doctor_;
    std::vector<int> first_segment_;
    detail::collective_segments nccl_; //!< which segments and graphs make collective calls
    cuda::nccl_launch_order nccl_order_;
    cuda::pinned_buffer<int> rerun_flag_; //!< where refused() reads the rerun flag (programs with a rerun, from the first step)
    int warm_steps_ = 0; //!< steps since construction or reset(), up to the warmup
    bool warmup_started_ = false;
    bool captured_ahead_ = false;
    void run_warmup_hooks(warmup_point when, cudaStream_t s) const {
        if (program_.warmup.run) program_.warmup.run(program_.warmup.pipeline, when == warmup_point::before, s);
    }
};

} // namespace capscope
