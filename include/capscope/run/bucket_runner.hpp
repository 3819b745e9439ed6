#pragma once
//! @file
//! `bucket_runner<Source>`: runs an `inference_program`, one forward per request, in the
//! bucket the request fits (capscope/plan/buckets.hpp). The language model's runner
//! (`inference_runner<Config>`) and the vision encoder's (`vision_runner<Config>`) are this class
//! with settings read off a configuration (capscope/run/inference_runner.hpp).
//!
//! Each bucket runs its first `warmup_runs` forwards eagerly, then replays graphs: captured the
//! first time they run (lazy) or all at once before the first replay (ahead of time). Replay is
//! one `cudaGraphLaunch` per graphed segment and the eager islands' own stage calls, as in the
//! training runner: no allocation, no virtual call, no lookup by name.
//!
//! A graph is instantiated once. When it has to be captured again with the same topology (its
//! stages rebound to other buffers by `rebind`, or, with `bucket_exec::shared`, the graph of a
//! sibling bucket loaded into the one executable graph of that segment), the new graph is applied
//! to the executable one with `cudaGraphExecUpdate`; it is instantiated anew only when CUDA
//! refuses the update. `counters()` counts both. Capture, failures, scratch memory and updates
//! are the training runner's (capscope/run/segment_executor.hpp).
//!
//! Segments whose stages make collective calls (a tensor-parallel all-reduce) keep NCCL's rules
//! for graphs when its graph-mixing support is off, as the training runner's do
//! (capscope/cuda/nccl_graph_mixing.hpp). So does `eager_forward`, past the largest bucket, when
//! any stage of the program makes collective calls: it runs the same forward. With the support
//! off, a collective island waits on the host for the graph before it, within one `run`: one
//! thread cannot drive several ranks' runners then (NCCL's own rule, which needs a thread per rank).

#include <capscope/cuda/error.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/plan/inference_plan.hpp>
#include <capscope/plan/inference_settings.hpp>
#include <capscope/run/capture_failed.hpp>
#include <capscope/run/counters.hpp>
#include <capscope/run/runner.hpp>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

namespace capscope {

//! `Source::value` is the runner's `bucket_runner_settings` (a constant).
template <class Source>
class bucket_runner {
    static constexpr bucket_runner_settings Settings = Source::value;

public:
    //! Plans every bucket (throws `plan_error`). Nothing is captured yet.
    explicit bucket_runner(inference_program program)
        : program_(std::move(program)),
          plan_(make_inference_plan(Settings.scope, Settings.modules, Settings.sizes, program_)),
          calls_(detail::bind_calls(plan_, program_)),
          executor_(Settings.mode, Settings.on_failure),
          nccl_(detail::collective_segments_of(plan_.segments, calls_)) {
        const std::size_t per_bucket = std::size_t(plan_.sizes.size()) * std::size_t(plan_.graphs_per_bucket);
        execs_.resize(Settings.execs == bucket_exec::shared ? std::size_t(plan_.graphs_per_bucket) : per_bucket);
        if (Settings.execs == bucket_exec::shared) templates_.resize(per_bucket);
        loaded_.assign(execs_.size(), -1);
        stale_.assign(per_bucket, 0);
        run_eagerly_.assign(per_bucket, 0);
        runs_.assign(std::size_t(plan_.sizes.size()), 0);
    }
    bucket_runner(bucket_runner&&) noexcept = default;
    // Members move in order: the old scratch arena is freed (cudaFree synchronizes) before the old
    // executable graphs are destroyed; they are never launched again.
    bucket_runner& operator=(bucket_runner&&) noexcept = default;
    ~bucket_runner() { release_graphs(); }

    //! The bucket a request of `rows` rows runs in (P6 past the largest, or an eager choice).
    bucket_choice choose(int rows) const { return choose_bucket(plan_.sizes, rows, Settings.on_oversize); }
    //! The length bucket of a batch of variable-length samples (P7 names a sample past the largest).
    bucket_choice choose_lengths(std::span<const int> lengths) const { return choose_length_bucket(plan_.sizes, lengths).bucket; }

    //! Runs one forward in `c`'s bucket on `s` (a stream of its own). The inputs must already be
    //! padded to `c.size` rows; an eager choice runs `inference_program::eager_forward`.
    void run(const bucket_choice& c, cudaStream_t s) {
        executor_.follow_previous_step(s); // a run on another stream than the last waits for it
        if (c.eager()) {
            run_oversize(c, s);
            return;
        }
        const int b = checked_bucket(c);
        if (plan_.graphs_per_bucket > 0) detail::require_capturable_stream(s);
        scratch_scope scratch(executor_.scratch());
        runner_counters& k = executor_.counters();
        detail::count_one(k.steps);
        if constexpr (Settings.scope == inference_scope::eager) {
            run_bucket_eagerly(b, s);
        } else if (runs_[std::size_t(b)] < Settings.warmup_runs) {
            run_bucket_eagerly(b, s);
            ++runs_[std::size_t(b)]; // counts up to warmup_runs only
        } else {
            if (Settings.ahead_of_time && !captured_ahead_) capture_all(s);
            for (const plan_segment* seg = plan_.bucket_begin(b); seg != plan_.bucket_end(b); ++seg) {
                if (seg->graphed && !run_eagerly_[index(b, seg->graph)] && ready(b, *seg, s)) {
                    const cuda::graph_exec& exec = execs_[slot(b, seg->graph)];
                    if (collective(*seg)) nccl_order_.launch(exec, s); // (NCCL's rules without graph mixing)
                    else exec.launch(s);
                    detail::count_one(k.replays);
                    continue;
                }
                run_segment_eagerly(*seg, s);
            }
        }
    }
    //! `run(choose(rows), s)`; returns the choice.
    bucket_choice run(int rows, cudaStream_t s) {
        const bucket_choice c = choose(rows);
        run(c, s);
        return c;
    }

    //! Warms up and captures every bucket now, largest first (as serving engines do before
    //! taking requests). Runs forwards on whatever the input buffers hold.
    void capture_all(cudaStream_t s) {
        captured_ahead_ = true;
        if constexpr (Settings.scope != inference_scope::eager) {
            if (plan_.graphs_per_bucket > 0) detail::require_capturable_stream(s);
            scratch_scope scratch(executor_.scratch());
            for (int b = plan_.sizes.size() - 1; b >= 0; --b) {
                while (runs_[std::size_t(b)] < Settings.warmup_runs) run(bucket_choice{b, plan_.sizes[b], plan_.sizes[b]}, s);
                for (const plan_segment* seg = plan_.bucket_begin(b); seg != plan_.bucket_end(b); ++seg)
                    if (seg->graphed && !run_eagerly_[index(b, seg->graph)]) ready(b, *seg, s);
            }
        }
    }

    //! Binds the runner to a program with the same stages on other buffers (double-buffered
    //! inputs, say). Graphs whose stages changed are captured again at their next use and
    //! applied to their executable graphs with `cudaGraphExecUpdate`. Throws `plan_error` (P3)
    //! when the stages differ in more than their bindings.
    void rebind(inference_program program) {
        inference_plan plan = make_inference_plan(Settings.scope, Settings.modules, Settings.sizes, program);
        for (std::size_t b = 0; b < program.buckets.size(); ++b) {
            if (program.buckets[b].size() != program_.buckets[b].size())
                throw plan_error("P3", "",
                                 "rebind: bucket " + std::to_string(plan.sizes[int(b)]) + " has " + std::to_string(program.buckets[b].size()) +
                                     " stages, the bound program's has " + std::to_string(program_.buckets[b].size()),
                                 "rebind only moves stages to other buffers; build a new runner for other stages");
            for (std::size_t i = 0; i < program.buckets[b].size(); ++i)
                if (!(program.buckets[b][i].facts() == program_.buckets[b][i].facts()))
                    throw plan_error("P3", program.buckets[b][i].name,
                                     "rebind: stage '" + program.buckets[b][i].name + "' differs from the bound program's '" +
                                         program_.buckets[b][i].name + "' in kind, layer, regions or capture facts",
                                     "rebind only moves stages to other buffers; build a new runner for other stages");
        }
        for (int b = 0; b < plan.sizes.size(); ++b)
            for (const plan_segment* seg = plan.bucket_begin(b); seg != plan.bucket_end(b); ++seg) {
                if (!seg->graphed) continue;
                for (int k = 0; k < seg->call_count; ++k) {
                    const stage_call& c = plan.calls[std::size_t(seg->first_call + k)];
                    if (!stage_of(program, c).same_binding(stage_of(program_, c))) stale_[index(b, seg->graph)] = 1;
                }
            }
        program_ = std::move(program);
        plan_ = std::move(plan);
        calls_ = detail::bind_calls(plan_, program_);
        nccl_ = detail::collective_segments_of(plan_.segments, calls_);
    }

    //! Frees every graph and returns to the state after construction (eager warmup again).
    //! Counters are kept.
    void reset() {
        release_graphs();
        runs_.assign(runs_.size(), 0);
        captured_ahead_ = false;
    }

    const inference_plan& plan() const noexcept { return plan_; }
    const inference_program& program() const noexcept { return program_; }
    const runner_counters& counters() const noexcept { return executor_.counters(); }
    //! The last failure met while capturing, in words ("" if none).
    const std::string& last_failure() const noexcept { return executor_.last_failure(); }
    //! The runner's scratch memory: its pool, and the arena its graphs share.
    const scratch_pool& scratch() const noexcept { return executor_.scratch(); }
    std::string plan_text() const { return to_text(plan_, program_); }
    //! The first bucket's plan as Graphviz DOT (`dot -Tsvg`).
    std::string plan_dot() const { return to_dot(plan_, program_); }
    static constexpr const bucket_runner_settings& settings() noexcept { return Settings; }
    //! Executable graphs alive, and captured graphs kept (`bucket_exec::shared` keeps each
    //! bucket's captured graph to update from).
    int executable_graphs() const { return count_alive(execs_); }
    int captured_graphs() const { return count_alive(templates_); }
    int graphs_alive() const { return executable_graphs() + captured_graphs(); }
    //! CUDA's reason for the last refused update, in words ("none" if none was refused).
    const char* last_update_refusal() const noexcept { return executor_.last_update_refusal(); }

private:
    std::size_t index(int b, int g) const { return std::size_t(b) * std::size_t(plan_.graphs_per_bucket) + std::size_t(g); }
    std::size_t slot(int b, int g) const { return Settings.execs == bucket_exec::shared ? std::size_t(g) : index(b, g); }
    template <class V>
    static int count_alive(const V& v) {
        int n = 0;
        for (const auto& x : v) n += x ? 1 : 0;
        return n;
    }

    int checked_bucket(const bucket_choice& c) const {
        if (c.index < 0 || c.index >= plan_.sizes.size() || plan_.sizes[c.index] != c.size || c.requested > c.size || c.requested < 1)
            throw std::invalid_argument("capscope: bucket_choice {" + std::to_string(c.index) + ", " + std::to_string(c.size) + ", " +
                                        std::to_string(c.requested) + "} is not one of this runner's buckets " +
                                        detail::bucket_text(plan_.sizes) + "; take it from choose()");
        return c.index;
    }

    void run_oversize(const bucket_choice& c, cudaStream_t s) {
        if (!program_.eager_forward)
            throw std::logic_error("capscope: a request of " + std::to_string(c.requested) +
                                   " rows is past the largest bucket and the config runs it eagerly, but the inference program has no "
                                   "eager_forward; bind inference_program::eager_forward");
        scope_label label("eager forward (past the largest bucket)");
        if (std::find(nccl_.begin(), nccl_.end(), 1) != nccl_.end()) nccl_order_.eager(s, [&] { program_.eager_forward(s, c.requested); });
        else program_.eager_forward(s, c.requested);
        detail::count_one(executor_.counters().steps);
        detail::count_one(executor_.counters().oversize_runs);
    }

    void run_bucket_eagerly(int b, cudaStream_t s) {
        for (const plan_segment* seg = plan_.bucket_begin(b); seg != plan_.bucket_end(b); ++seg) run_segment_eagerly(*seg, s);
    }

    bool collective(const plan_segment& seg) const { return nccl_[std::size_t(&seg - plan_.segments.data())] != 0; }
    void run_segment_eagerly(const plan_segment& seg, cudaStream_t s) {
        if (collective(seg)) nccl_order_.eager(s, [&] { executor_.run_eagerly(calls_of(seg), s, 0); });
        else executor_.run_eagerly(calls_of(seg), s, 0);
    }

    std::span<const detail::bound_call> calls_of(const plan_segment& seg) const {
        return {calls_.data() + seg.first_call, std::size_t(seg.call_count)};
    }

    //! Makes bucket b's graph of `seg` launchable in its slot; false when a capture-rule failure
    //! leaves it eager (policy `run_eagerly`). A rebind marks a graph stale; it stays stale until
    //! the new graph is applied, so a failed update is tried again, never skipped.
    bool ready(int b, const plan_segment& seg, cudaStream_t s) {
        const std::size_t i = index(b, seg.graph), e = slot(b, seg.graph);
        const std::string_view scope = calls_[std::size_t(seg.first_call)].name;
        if constexpr (Settings.execs == bucket_exec::shared) {
            if (loaded_[e] == b && !stale_[i] && execs_[e]) return true;
            if (!templates_[i] || stale_[i]) {
                cuda::graph g = capture(b, seg, s);
                if (!g) return false;
                templates_[i] = std::move(g);
                stale_[i] = 0; // the template is current; the executable graph is loaded below
            }
            loaded_[e] = -1; // unknown until the update has been applied
            executor_.apply(execs_[e], templates_[i], scope);
            loaded_[e] = b;
            return true;
        } else {
            if (execs_[e] && !stale_[i]) return true;
            cuda::graph g = capture(b, seg, s);
            if (!g) return false;
            executor_.apply(execs_[e], g, scope);
            stale_[i] = 0;
            return true;
        }
    }

    cuda::graph capture(int b, const plan_segment& seg, cudaStream_t s) {
        cuda::graph g = executor_.capture(calls_of(seg), s, 0, [&] {
            return segment_site{"graph g" + std::to_string(seg.graph) + " of bucket " + std::to_string(plan_.sizes[b]), seg.layer, seg.graph, b};
        });
        if (!g) run_eagerly_[index(b, seg.graph)] = 1;
        else if (collective(seg)) nccl_order_.captured(); // (before its first launch: NCCL's upload, without graph mixing)
        return g;
    }

    void release_graphs() noexcept {
        const bool had = graphs_alive() > 0;
        for (auto& e : execs_) e = cuda::graph_exec{};
        for (auto& t : templates_) t = cuda::graph{};
        loaded_.assign(loaded_.size(), -1);
        stale_.assign(stale_.size(), 0);
        run_eagerly_.assign(run_eagerly_.size(), 0);
        executor_.release(had);
    }

    inference_program program_;
    inference_plan plan_;
    std::vector<detail::bound_call> calls_;
    segment_executor executor_;
    std::vector<cuda::graph_exec> execs_;   //!< per (bucket, graph), or per graph when shared
    std::vector<cuda::graph> templates_;    //!< shared: each bucket's captured graph, per (bucket, graph)
    std::vector<int> loaded_;               //!< shared: the bucket whose graph an executable graph holds
    std::vector<unsigned char> stale_;      //!< per (bucket, graph): rebound, capture again
    std::vector<unsigned char> run_eagerly_; //!< per (bucket, graph): capture failed, policy run_eagerly
    std::vector<unsigned char> nccl_;       //!< per segment: its stages make collective calls
    cuda::nccl_launch_order nccl_order_;
    std::vector<int> runs_;                 //!< forwards per bucket since construction or reset(), up to the warmup
    bool captured_ahead_ = false;
};

} // namespace capscope
