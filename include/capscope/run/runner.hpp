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
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/plan/layer_plan.hpp>
#include <capscope/plan/match_schemas.hpp>
#include <capscope/plan/print.hpp>
#include <capscope/plan/training_plan.hpp>
#include <capscope/run/capture_failed.hpp>
#include <capscope/run/counters.hpp>
#include <capscope/run/scratch.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capscope {

namespace detail {
constexpr cudaStreamCaptureMode cuda_capture_mode(capture_mode m) {
    switch (m) {
    case capture_mode::global: return cudaStreamCaptureModeGlobal;
    case capture_mode::per_thread: return cudaStreamCaptureModeThreadLocal;
    case capture_mode::relaxed: return cudaStreamCaptureModeRelaxed;
    }
    return cudaStreamCaptureModeThreadLocal;
}

//! A resolved stage call: the function and the name it runs under.
struct bound_call {
    stream_fn fn;
    std::string_view name;
};

//! Captures calls [first, first + count) on `s` into a graph, each under its name as the error
//! scope; `running` is the call being captured while it runs (-1 once all have run), so a
//! failure can name the stage.
inline cuda::graph capture_calls(const std::vector<bound_call>& calls, int first, int count, cudaStream_t s, capture_mode mode,
                                 int& running) {
    if (s == nullptr || s == cudaStreamLegacy)
        throw std::invalid_argument("the legacy default stream cannot be captured: give the runner a stream of its own (capscope::cuda::stream)");
    return cuda::capture(
        s,
        [&](cudaStream_t cs) {
            for (int k = 0; k < count; ++k) {
                running = first + k;
                const bound_call& c = calls[std::size_t(running)];
                scope_label label(c.name);
                c.fn(cs);
            }
            running = -1;
        },
        cuda_capture_mode(mode));
}

//! Returns the memory CUDA keeps for graph allocations (stream-ordered allocations made inside
//! captured segments) once a runner has freed the graphs that used it.
inline void trim_graph_memory() noexcept {
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGraphMemTrim(device);
    cudaGetLastError();
}
} // namespace detail

template <class Config, class Schemas = layer_schemas<>>
class runner;

template <class Config, class... Layers>
class runner<Config, layer_schemas<Layers...>> {
    // Naming each layer kind's plan checks it at compile time (rules P1, P2).
    static_assert(((layer_plan<Config, Layers>::segment_count > 0) && ...));

public:
    using config_type = Config;

    //! Plans the program (throws `plan_error`, or `schema_mismatch` when it does not match the
    //! declared schemas). Nothing is captured yet.
    explicit runner(training_program program)
        : program_(std::move(program)),
          plan_(make_training_plan(capture_scope_of<Config>, Config::warmup_steps, checked(program_))) {
        calls_.reserve(plan_.calls.size());
        for (const stage_call& c : plan_.calls) {
            const stage& st = stage_of(program_, c);
            calls_.push_back({c.direction == phase::forward ? st.forward : st.backward, st.name});
        }
        execs_.resize(std::size_t(plan_.graph_count));
        run_eagerly_.assign(std::size_t(plan_.graph_count), 0);
        first_segment_.assign(std::size_t(plan_.graph_count), -1);
        for (std::size_t i = 0; i < plan_.segments.size(); ++i) {
            const plan_segment& s = plan_.segments[i];
            if (s.graphed && first_segment_[std::size_t(s.graph)] < 0) first_segment_[std::size_t(s.graph)] = int(i);
        }
    }
    runner(const runner&) = delete;
    runner& operator=(const runner&) = delete;
    ~runner() { release_graphs(); }

    //! One training step on `s` (a non-default stream: the legacy stream cannot be captured).
    void step(cudaStream_t s) {
        scratch_scope scratch(scratch_);
        if (Config::impl == graph_impl::eager || warm_steps_ < plan_.warmup_steps) {
            for (const plan_segment& seg : plan_.segments) run_eagerly(seg, s);
        } else {
            if (Config::impl == graph_impl::ahead_of_time_per_layer && !captured_ahead_) capture_ahead_of_time(s);
            for (const plan_segment& seg : plan_.segments) {
                if (seg.graphed && !run_eagerly_[std::size_t(seg.graph)]) {
                    const cuda::graph_exec& exec = execs_[std::size_t(seg.graph)];
                    if (exec || capture(seg, s)) {
                        execs_[std::size_t(seg.graph)].launch(s);
                        ++counters_.replays;
                        continue;
                    }
                }
                run_eagerly(seg, s);
            }
        }
        ++counters_.steps;
        ++warm_steps_;
    }

    //! Frees every graph and returns to the state after construction: eager until the warmup
    //! steps have run again, then captured again. Counters are kept.
    void reset() {
        release_graphs();
        warm_steps_ = 0;
        captured_ahead_ = false;
    }

    const training_plan& plan() const noexcept { return plan_; }
    const training_program& program() const noexcept { return program_; }
    const runner_counters& counters() const noexcept { return counters_; }
    std::string plan_text() const { return to_text(plan_, program_); }
    std::string plan_dot() const { return to_dot(plan_, program_); }
    //! Executable graphs currently alive.
    int graphs_alive() const {
        int n = 0;
        for (const auto& e : execs_) n += e ? 1 : 0;
        return n;
    }
    //! The runner's scratch memory (capscope/run/scratch.hpp): its pool, and the arena its graphs share.
    const scratch_pool& scratch() const noexcept { return scratch_; }
    //! Graphs that failed to capture and run eagerly (policy `capture_failure::run_eagerly`).
    int graphs_run_eagerly() const {
        int n = 0;
        for (auto f : run_eagerly_) n += f;
        return n;
    }

private:
    static const training_program& checked(const training_program& p) {
        if constexpr (sizeof...(Layers) > 0) match_schemas(layer_schemas<Layers...>{}, p);
        return p;
    }

    void run_eagerly(const plan_segment& seg, cudaStream_t s) {
        scratch_.begin_segment(false);
        const detail::bound_call* c = calls_.data() + seg.first_call;
        for (const detail::bound_call* end = c + seg.call_count; c != end; ++c) {
            scope_label label(c->name);
            c->fn(s);
        }
        scratch_.end_segment(calls_[std::size_t(seg.first_call)].name);
        ++counters_.eager_segment_runs;
    }

    void capture_ahead_of_time(cudaStream_t s) {
        for (int g = 0; g < plan_.graph_count; ++g)
            if (!execs_[std::size_t(g)] && !run_eagerly_[std::size_t(g)]) capture(plan_.segments[std::size_t(first_segment_[std::size_t(g)])], s);
        captured_ahead_ = true;
    }

    //! Captures and instantiates a segment's graph; false when it failed and the policy is to
    //! run it eagerly (a failure under `raise` throws `capture_failed`).
    bool capture(const plan_segment& seg, cudaStream_t s) {
        int running = -1;
        try {
            scratch_.reserve_arena();
            scratch_.begin_segment(true);
            cuda::graph g = detail::capture_calls(calls_, seg.first_call, seg.call_count, s, Config::engine.mode, running);
            scratch_.end_segment(calls_[std::size_t(seg.first_call)].name);
            ++counters_.captures;
            execs_[std::size_t(seg.graph)] = cuda::graph_exec(g);
            ++counters_.instantiations;
            return true;
        } catch (const std::exception& e) {
            scratch_.begin_segment(false); // forget the failed segment's scratch
            cudaGetLastError(); // the failure is reported here, not by the next call
            ++counters_.capture_failures;
            const std::string stage_name = running >= 0 ? std::string(calls_[std::size_t(running)].name) : std::string();
            if (Config::engine.on_failure == capture_failure::raise)
                throw capture_failed(failure_message(seg, stage_name, e.what()), stage_name, seg.layer, seg.graph, seg.microbatch);
            run_eagerly_[std::size_t(seg.graph)] = 1;
            return false;
        }
    }

    std::string failure_message(const plan_segment& seg, const std::string& stage_name, const char* why) const {
        std::string where = "graph g" + std::to_string(seg.graph) + " (" +
                            (seg.layer >= 0 ? "layer " + std::to_string(seg.layer) : std::string("outside the layers")) +
                            (seg.microbatch >= 0 ? ", microbatch " + std::to_string(seg.microbatch) : std::string()) + ", " +
                            std::string(phase_name(seg.direction)) + ": " + detail::segment_stages(plan_, program_, seg, ", ") + ")";
        return "capscope: capturing " + where + " failed" +
               (stage_name.empty() ? std::string(" when the capture ended") : " in stage '" + stage_name + "'") + ": " + why +
               "\n  the capture was ended and its partial graph destroyed; the stream is usable"
               "\n  fix: tag the stage (synchronizes_with_host / shapes_depend_on_data) so the plan keeps it out of graphs, "
               "or build the runner with on_capture_failure<capture_failure::run_eagerly>";
    }

    void release_graphs() noexcept {
        const bool had = graphs_alive() > 0;
        for (cuda::graph_exec& e : execs_) e = cuda::graph_exec{};
        run_eagerly_.assign(run_eagerly_.size(), 0);
        scratch_.release_retired();
        if (had) detail::trim_graph_memory();
    }

    training_program program_;
    training_plan plan_;
    scratch_pool scratch_;
    std::vector<detail::bound_call> calls_;
    std::vector<cuda::graph_exec> execs_;
    std::vector<unsigned char> run_eagerly_;
    std::vector<int> first_segment_;
    runner_counters counters_;
    int warm_steps_ = 0; //!< steps since construction or reset(): warmup counts these
    bool captured_ahead_ = false;
};

} // namespace capscope
