#pragma once
//! @file
//! `segment_executor`: what both runners do with a segment (a run of stage calls): run it
//! eagerly, capture it into a graph, turn a graph into an executable one (instantiate, or update
//! in place), and say what went wrong. One implementation, so the training runner and the bucket
//! runners capture, fail and clean up alike.
//!
//! Calls on another lane than the segment's (inside the whole iteration, or a branch) fork from
//! the segment's stream and join back before it ends (capscope/run/lanes.hpp); each call waits
//! for the events the plan gives it and records the one the plan asks for
//! (capscope/plan/stream_order.hpp), from the executor's event table. Scratch memory comes from
//! the executor's pool (capscope/run/scratch.hpp), for work on the step's stream only.
//!
//! Failures while capturing are sorted in two:
//! - capture-rule errors (a call that a capture forbids, a capture invalidated or left unjoined):
//!   the stage should have been tagged. They raise `capture_failed` with that fix, or, under
//!   `capture_failure::run_eagerly`, leave the segment eager.
//! - everything else (out of memory, a failed instantiation, a scratch arena too small, the
//!   trainer's own exceptions) is rethrown as it was thrown, whatever the policy; CUDA errors
//!   carry the stage as their scope, and `last_failure()` says where it happened.
//! Either way the capture is ended on every stream it reached, the partial graph destroyed and
//! the streams usable, and CUDA's last-error state keeps errors that are not the capture's.

#include <capscope/config/engine_options.hpp>
#include <capscope/cuda/conditional.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/plan/plan_calls.hpp>
#include <capscope/run/capture_doctor.hpp>
#include <capscope/run/capture_failed.hpp>
#include <capscope/run/counters.hpp>
#include <capscope/run/lanes.hpp>
#include <capscope/run/scratch.hpp>
#include <capscope/stage/stage.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
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

//! A resolved stage call: the function, the name it runs under, its lane, the plan's waits
//! before it and event after it, and the streams it forks onto itself.
struct bound_call {
    stream_fn fn;
    std::string_view name;
    int lane = 0;
    std::span<const derived_wait> waits;
    int record = -1;
    std::span<const stream_handle> forks_to;
    bool capture_only = false; //!< run while capturing only (stage::capture_only)
    const stage_guard* guard = nullptr; //!< its stage's guard, or null when unguarded
    //! The plan's call (its list and pass: a guarded run never crosses from one to the next, as
    //! the plan's do not, though a whole-step segment holds a stage's forward next to its backward).
    const stage_call* call = nullptr;
    //! It makes collective calls (stage::collective_calls): NCCL's eager path waits, queries and
    //! forks on streams of its own that its captured path does not use, so the doctor leaves it be.
    bool collective = false;
    //! Updated in the graph (stage::updated_in_graph): captured as a child graph of its own, which
    //! `refresh` records again and puts in place before each replay.
    bool updated = false;
};

//! A call updated in the graph, in a captured segment: its offset among the segment's calls, and
//! the child graph node that holds it (in the graph the executable was instantiated from).
struct updated_node {
    int call = 0;
    cudaGraphNode_t node = nullptr;
};

//! Whether calls `a` and `b` belong to one guarded run (one conditional node).
inline bool same_guarded_run(const bound_call& a, const bound_call& b) {
    return a.guard && b.guard && *a.guard == *b.guard && a.lane == b.lane && same_list(*a.call, *b.call);
}

//! Clears the scratch pool's side-lane mark however the call it brackets ends.
class side_lane_mark {
public:
    side_lane_mark(scratch_pool& pool, bool side) noexcept : pool_(pool) { pool_.on_side_lane(side); }
    ~side_lane_mark() { pool_.on_side_lane(false); }
    side_lane_mark(const side_lane_mark&) = delete;
    side_lane_mark& operator=(const side_lane_mark&) = delete;

private:
    scratch_pool& pool_;
};

constexpr bool is_capture_rule_code(int code) {
    switch (code) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread: return true;
    default: return false;
    }
}

inline long microseconds_since(std::chrono::steady_clock::time_point t) {
    return long(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t).count());
}

//! A failing clean-up call set CUDA's last error; it is ours, so clear it.
inline void clear_own(cudaError_t e) noexcept {
    if (e != cudaSuccess) (void)cudaGetLastError();
}

//! Returns the memory CUDA keeps for graph allocations (stream-ordered allocations made inside
//! captured segments) once a runner has freed the graphs that used it.
inline void trim_graph_memory() noexcept {
    int device = 0;
    const cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) clear_own(cudaDeviceGraphMemTrim(device));
    else clear_own(e);
}

} // namespace detail

//! Where a failed capture was, for its message: "graph g3 (layer 1, microbatch 0, forward: ...)".
struct segment_site {
    std::string where;
    int layer = -1, graph = -1, index = -1; //!< index: the microbatch, or the bucket
};

class segment_executor {
public:
    segment_executor(capture_mode mode, capture_failure policy) : mode_(mode), policy_(policy) {}

    //! Runs `calls` eagerly on `origin`, the stream of lane `origin_lane`.
    void run_eagerly(std::span<const detail::bound_call> calls, cudaStream_t origin, int origin_lane) {
        scratch_.begin_segment(false);
        int running = -1;
        execute(calls, origin, origin_lane, running, false);
        scratch_.end_segment(calls.front().name);
        detail::count_one(counters_.eager_segment_runs);
    }

    //! Captures `calls` into a graph on `origin` (lane `origin_lane`). Returns an empty graph when
    //! a capture-rule error is met under `capture_failure::run_eagerly`; throws `capture_failed`
    //! for one under `raise`; rethrows anything else unchanged. `describe()` gives the site, and
    //! is called only on failure.
    template <class Describe>
    cuda::graph capture(std::span<const detail::bound_call> calls, cudaStream_t origin, int origin_lane, Describe&& describe) {
        int running = -1;
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        try {
            begin_capture(origin, calls.data());
            try {
                execute(calls, origin, origin_lane, running, true);
                running = -1;
            } catch (...) {
                status = capture_status(origin);
                abort_capture(calls, origin);
                throw;
            }
            return end_capture(calls, origin);
        } catch (const std::exception& e) {
            return failed_capture(e, status, running >= 0 ? calls[std::size_t(running)].name : std::string_view(), describe());
        }
    }

    //! Piecewise, for calls that come a few at a time (capscope/run/in_place_runner.hpp): a
    //! segment is opened (eagerly, or capturing: `begin_capture`), runs of its calls are executed
    //! as they come (`execute_part`), and it is closed (`close_eager`, or `end_capture`); the lanes
    //! its calls forked are joined at the close. A failure while capturing goes through
    //! `abort_capture` and `failed_capture`, as `capture` does.
    void open_eager() {
        scratch_.begin_segment(false);
        forked_here_ = 0;
    }
    //! `first`: the segment's first call, from which calls updated in the graph are counted.
    void begin_capture(cudaStream_t origin, const detail::bound_call* first = nullptr) {
        capture_started_ = std::chrono::steady_clock::now();
        captured_updates_.clear();
        capture_first_ = first;
        scratch_.reserve_arena();
        scratch_.begin_segment(true);
        forked_here_ = 0;
        CAPSCOPE_CHECK(cudaStreamBeginCapture(origin, detail::cuda_capture_mode(mode_)));
    }
    //! Runs `calls` in an open segment; `running` is the index of the call running, for failures.
    void execute_part(std::span<const detail::bound_call> calls, cudaStream_t origin, int origin_lane, int& running, bool capturing) {
        execute_range(calls, origin, origin_lane, running, capturing);
    }
    void close_eager(cudaStream_t origin, std::string_view first) {
        join_forks(origin);
        scratch_.end_segment(first);
        detail::count_one(counters_.eager_segment_runs);
    }
    //! Joins the forked lanes and ends the capture: the graph of the segment `calls`.
    cuda::graph end_capture(std::span<const detail::bound_call> calls, cudaStream_t origin) {
        join_forks(origin);
        cudaGraph_t captured = nullptr;
        const cudaError_t ended = cudaStreamEndCapture(origin, &captured);
        if (ended != cudaSuccess) {
            if (captured) cudaGraphDestroy(captured);
            end_side_captures(calls);
            cuda::detail::check_status(ended, "cudaStreamEndCapture(origin, &captured)", __FILE__, __LINE__);
        }
        cuda::graph g(captured);
        scratch_.end_segment(calls.front().name);
        detail::count_one(counters_.captures);
        detail::add_time(counters_.capture_us, counters_.longest_capture_us, detail::microseconds_since(capture_started_));
        return g;
    }
    //! The capture status of `origin` (at a failure: was the capture invalidated?).
    static cudaStreamCaptureStatus capture_status(cudaStream_t origin) noexcept {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(origin, &status) != cudaSuccess) status = cudaStreamCaptureStatusNone;
        return status;
    }
    //! What a failed capture comes to, after the capture was ended (call it from the handler that
    //! caught `e`: an error that is not a capture's is rethrown as it was, by `throw;`): an empty graph (a capture-rule
    //! error under `capture_failure::run_eagerly`), `capture_failed` (one under `raise`), or the
    //! error as it was thrown. `stage` is the call that was running ("": the capture's end).
    cuda::graph failed_capture(const std::exception& e, cudaStreamCaptureStatus status, std::string_view running, const segment_site& site) {
        scratch_.begin_segment(false); // forget the failed segment's scratch
        detail::count_one(counters_.capture_failures);
        const std::string stage(running);
        const std::string what = "capscope: capturing " + site.where + " failed" +
                                 (stage.empty() ? std::string(" when the capture ended") : " in stage '" + stage + "'") + ": " + e.what();
        last_failure_ = what;
        forget_reported_error(e);
        if (!capture_rule_error(e, status)) throw; // not a tagging problem: as it was thrown
        // with_hooks names its stages "layerN.hook.<name>" and "step.hook.<name>": a hook is not tagged, it is placed.
        const bool hook = stage.find(".hook.") != std::string::npos;
        if (policy_ == capture_failure::raise)
            throw capture_failed(what + "\n  the capture was ended and its partial graph destroyed; the streams are usable"
                                        "\n  fix: " +
                                     std::string(hook ? "make the hook a boundary hook (hook<phase, boundary>), which runs on the host "
                                                        "around the graphs, or keep the call that a capture refuses out of its body"
                                                      : "tag the stage (synchronizes_with_host / shapes_depend_on_data / passes_host_values) "
                                                        "so the plan keeps it out of graphs") +
                                     ", or build the runner with on_capture_failure<capture_failure::run_eagerly>",
                                 stage, site.layer, site.graph, site.index);
        return {};
    }

    //! Ends a capture that a call left by an exception: joins each stream it may have reached
    //! into `origin`, ends the capture there and destroys the partial graph.
    void abort_capture(std::span<const detail::bound_call> calls, cudaStream_t origin) noexcept {
        cudaEvent_t join = nullptr;
        detail::clear_own(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        auto join_into_origin = [&](cudaStream_t side) {
            cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
            if (side == origin || !join || cudaStreamIsCapturing(side, &st) != cudaSuccess || st != cudaStreamCaptureStatusActive) return;
            detail::clear_own(cudaEventRecord(join, side));
            detail::clear_own(cudaStreamWaitEvent(origin, join, 0));
        };
        for_each_side_stream(calls, join_into_origin);
        cudaGraph_t partial = nullptr;
        detail::clear_own(cudaStreamEndCapture(origin, &partial));
        if (partial) cudaGraphDestroy(partial);
        if (join) cudaEventDestroy(join);
        end_side_captures(calls);
        forked_here_ = 0;
    }

    //! The calls updated in the graph that the last capture met (`updated_node::call` counts from
    //! the first call of `calls` given to `capture`, or to `execute_part` after `begin_capture`).
    std::vector<detail::updated_node> take_captured_updates() { return std::move(captured_updates_); }

    //! Before a replay of `exec`: each call of `calls` updated in the graph is recorded again,
    //! alone, and its child graph node in `exec` set to the new recording. Returns the name of the
    //! first call whose new recording the graph cannot take (another kernel, another count or
    //! order of nodes), with CUDA's reason in `why`; {} when every update was taken.
    std::string_view refresh(const cuda::graph_exec& exec, std::span<const detail::updated_node> nodes, std::span<const detail::bound_call> calls,
                             std::string& why) {
        if (detail::installed_breakage().skip_graph_updates) return {}; // a test, broken on purpose: the graph keeps old values
        const auto started = std::chrono::steady_clock::now();
        std::string_view refused;
        for (const detail::updated_node& u : nodes)
            if (!(refused = update_node(exec, u, calls[std::size_t(u.call)], why)).empty()) break;
        detail::add_time(counters_.update_us, counters_.longest_update_us, detail::microseconds_since(started));
        return refused;
    }

    //! One call updated in the graph, recorded again now and set in `exec` (an in_place_runner
    //! at the region's own arrival). The same answer as `refresh`.
    std::string_view refresh_one(const cuda::graph_exec& exec, const detail::updated_node& u, const detail::bound_call& c, std::string& why) {
        if (detail::installed_breakage().skip_graph_updates) return {};
        const auto started = std::chrono::steady_clock::now();
        const std::string_view refused = update_node(exec, u, c, why);
        detail::add_time(counters_.update_us, counters_.longest_update_us, detail::microseconds_since(started));
        return refused;
    }

    //! `g`, copied without its user objects (cuda/graph_copy.hpp) so that the launches of a graph
    //! holding NCCL's do not wait once 28 are in flight; `g` itself when it holds a node the copy
    //! does not take, or calls updated in the graph (their child nodes are addressed in `g`).
    cuda::graph launchable(cuda::graph g, bool has_updated_calls) {
        if (has_updated_calls || detail::installed_breakage().keep_user_objects) return g; // (the latter: a test, broken on purpose)
        cuda::copy_result r = cuda::without_user_objects(std::move(g));
        detail::count_one(r.refused.empty() ? counters_.user_object_copies : counters_.copies_refused);
        counters_.mem_op_kernels += long(r.mem_op_kernels);
        counters_.mem_op_nodes_kept += long(r.mem_op_nodes_kept);
        counters_.event_records_dropped += long(r.event_records_dropped);
        return std::move(r.copy);
    }

    //! Makes `exec` run `g`: updated in place when it exists and CUDA accepts the update,
    //! instantiated otherwise. On an exception `exec` is left empty (never half updated), so the
    //! next use instantiates it again.
    void apply(cuda::graph_exec& exec, const cuda::graph& g, std::string_view scope) {
        scope_label label(scope);
        const auto started = std::chrono::steady_clock::now();
        try {
            if (exec) {
                cudaGraphExecUpdateResult why = cudaGraphExecUpdateSuccess;
                if (exec.update(g, &why) == cuda::update_result::updated) {
                    detail::count_one(counters_.exec_updates);
                    detail::add_time(counters_.instantiate_us, counters_.longest_instantiate_us, detail::microseconds_since(started));
                    return;
                }
                detail::count_one(counters_.update_refusals);
                last_refusal_ = why;
            }
            exec = cuda::graph_exec(g);
            detail::count_one(counters_.instantiations);
            detail::add_time(counters_.instantiate_us, counters_.longest_instantiate_us, detail::microseconds_since(started));
        } catch (...) {
            exec = cuda::graph_exec{};
            throw;
        }
    }

    //! After the runner freed its graphs: frees retired scratch arenas and graph memory.
    void release(bool had_graphs) noexcept {
        scratch_.release_retired();
        if (had_graphs) detail::trim_graph_memory();
    }

    //! Makes the event table hold `count` events (set-up: the plan's events, created once).
    void prepare_events(std::size_t count) {
        while (events_.size() < count) events_.emplace_back();
    }

    //! Orders a step after the one before it when it comes on another stream: consecutive steps
    //! share the scratch arena, the lanes and the plan's events, which one stream orders by itself.
    //! On the same stream (the common case) it is one comparison and no CUDA call.
    void follow_previous_step(cudaStream_t s) {
        if (previous_ && *previous_ == s) return;
        if (previous_) {
            if (!handover_) handover_.emplace();
            handover_->record(*previous_);
            handover_->wait_on(s);
        }
        previous_ = s;
    }

    scratch_pool& scratch() noexcept { return scratch_; }
    const scratch_pool& scratch() const noexcept { return scratch_; }
    lane_streams& lanes() noexcept { return lanes_; }
    //! Waits on `s` for the events of `waits`.
    void wait(std::span<const derived_wait> waits, cudaStream_t s) const {
        for (const derived_wait& w : waits) events_[std::size_t(w.event)].wait_on(s);
    }
    //! Records event `event` on `s` (nothing for -1).
    void record(int event, cudaStream_t s) const {
        if (event >= 0) events_[std::size_t(event)].record(s);
    }
    runner_counters& counters() noexcept { return counters_; }
    //! The capture doctor that watches the eager calls from now on (null: none).
    void watch_with(detail::capture_doctor* doctor) noexcept { doctor_ = doctor; }
    const runner_counters& counters() const noexcept { return counters_; }
    //! The last failure met while capturing, in words ("" if none).
    const std::string& last_failure() const noexcept { return last_failure_; }
    //! CUDA's reason for the last refused update, in words ("none" if none was refused).
    const char* last_update_refusal() const noexcept { return cuda::update_refusal_name(last_refusal_); }

private:
    //! Runs each call under its name; calls on another lane fork from `origin` and are joined
    //! back into it at the end. Each call waits for the plan's events before it and records the
    //! plan's event after it. `running` is the call running (for failure messages).
    void execute(std::span<const detail::bound_call> calls, cudaStream_t origin, int origin_lane, int& running, bool capturing) {
        forked_here_ = 0;
        execute_range(calls, origin, origin_lane, running, capturing);
        join_forks(origin);
    }
    void join_forks(cudaStream_t origin) {
        if (forked_here_) lanes_.join(origin, forked_here_);
        forked_here_ = 0;
    }
    void execute_range(std::span<const detail::bound_call> calls, cudaStream_t origin, int origin_lane, int& running, bool capturing) {
        for (std::size_t i = 0; i < calls.size();) {
            const detail::bound_call& c = calls[i];
            cudaStream_t on = origin;
            if (c.lane != origin_lane) {
                on = lanes_.fork(c.lane, origin);
                forked_here_ |= std::uint32_t{1} << c.lane;
            }
            if (c.guard) {
                std::size_t end = i + 1;
                while (end < calls.size() && detail::same_guarded_run(c, calls[end])) ++end;
                execute_guarded(calls.subspan(i, end - i), i, on, running, capturing);
                i = end;
                continue;
            }
            running = int(i);
            scope_label label(c.name);
            wait(c.waits, on);
            call(c, on, capturing);
            record(c.record, on);
            ++i;
        }
    }

    void call(const detail::bound_call& c, cudaStream_t on, bool capturing) {
        if (capturing && c.updated) return capture_child(c, on);
        if (capturing || !c.capture_only) { // a capture-time call keeps its place in the stream order eagerly
            const detail::side_lane_mark side(scratch_, c.lane != 0); // a lane's work may not share the arena
            if (doctor_ && !c.collective) { // the last warmup step only: every CUDA call the stage makes is watched
                // A call updated in the graph is recorded alone on a stream of its own: watched, it
                // runs there too (forked and joined back), so the doctor names one that keeps using
                // the stream around it, whose work an update could never reach.
                const cudaStream_t given = c.updated ? fork_to_update_stream(on) : on;
                doctor_->enter(c.name, c.call, given);
                c.fn(given);
                doctor_->leave();
                if (c.updated) join_from_update_stream(on);
                return;
            }
            c.fn(on);
        }
    }

    //! `c` recorded again and set in `exec` in place of node `u`: {} when taken, else its name
    //! (and CUDA's reason in `why`).
    std::string_view update_node(const cuda::graph_exec& exec, const detail::updated_node& u, const detail::bound_call& c, std::string& why) {
        const cuda::graph g = record_for_update(c);
        const cudaError_t e = cudaGraphExecChildGraphNodeSetParams(exec.get(), u.node, g.get());
        if (e == cudaSuccess) {
            detail::count_one(counters_.graph_updates);
            return {};
        }
        (void)cudaGetLastError();
        why = cudaGetErrorString(e);
        return c.name;
    }

    //! A call updated in the graph, while `on` is captured: recorded alone on a stream of its own
    //! and added to the capture as a child graph node after what `on` had captured so far.
    void capture_child(const detail::bound_call& c, cudaStream_t on) {
        if (!capture_first_)
            throw std::logic_error("capscope: stage '" + std::string(c.name) + "' is updated in the graph, but its capture was begun "
                                   "without its segment's first call (begin_capture(origin, first))");
#if CUDART_VERSION >= 13000
        const cuda::graph child = record_alone(c);
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t parent = nullptr;
        const cudaGraphNode_t* deps = nullptr;
        std::size_t count = 0;
        CAPSCOPE_CHECK(cudaStreamGetCaptureInfo(on, &status, nullptr, &parent, &deps, nullptr, &count));
        cudaGraphNode_t node = nullptr;
        CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&node, parent, deps, count, child.get()));
        CAPSCOPE_CHECK(cudaStreamUpdateCaptureDependencies(on, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
        captured_updates_.push_back({int(&c - capture_first_), node});
#else
        (void)on;
        throw std::runtime_error("capscope: stage '" + std::string(c.name) + "' is updated in the graph, which needs CUDA 13 (its capture "
                                 "dependency calls) -- fix: build with CUDA 13, or keep the stage's values in device memory");
#endif
    }
    //! `c` alone, recorded into a graph of its own (what it launches this step, with this step's values).
    cudaStream_t fork_to_update_stream(cudaStream_t on) {
        if (!update_stream_) update_stream_.emplace();
        if (!update_fork_) update_fork_.emplace(), update_join_.emplace();
        update_fork_->record(on);
        update_fork_->wait_on(update_stream_->get());
        return update_stream_->get();
    }
    void join_from_update_stream(cudaStream_t on) {
        update_join_->record(update_stream_->get());
        update_join_->wait_on(on);
    }
    //! A recording for an update, outside any segment: scratch memory comes from the arena, as it
    //! did in the capture, so the recording has the captured topology.
    cuda::graph record_for_update(const detail::bound_call& c) {
        scratch_.begin_segment(true);
        const detail::side_lane_mark side(scratch_, c.lane != 0);
        cuda::graph g;
        try {
            g = record_alone(c);
        } catch (...) {
            scratch_.begin_segment(false);
            throw;
        }
        scratch_.end_segment(c.name);
        return g;
    }
    //! What it launches must be on the stream it is given: a recording with nothing in it means
    //! its work went elsewhere (a global stream), where no update reaches it.
    cuda::graph record_alone(const detail::bound_call& c) {
        cuda::graph g = record_alone_unchecked(c);
        if (g.node_count() == 0)
            throw std::logic_error("capscope: stage '" + std::string(c.name) + "' is updated in the graph, but recorded alone it launched "
                                   "nothing on the stream it was given: its work went to another stream (a global one), where a graph "
                                   "update cannot reach it -- fix: enqueue its work on the stream the stage is called with");
        return g;
    }
    cuda::graph record_alone_unchecked(const detail::bound_call& c) {
        if (!update_stream_) update_stream_.emplace();
        const cudaStream_t s = update_stream_->get();
        scope_label label(c.name);
        CAPSCOPE_CHECK(cudaStreamBeginCapture(s, detail::cuda_capture_mode(mode_)));
        try {
            c.fn(s);
        } catch (...) {
            cudaGraph_t partial = nullptr;
            detail::clear_own(cudaStreamEndCapture(s, &partial));
            if (partial) cudaGraphDestroy(partial);
            throw;
        }
        cudaGraph_t g = nullptr;
        CAPSCOPE_CHECK(cudaStreamEndCapture(s, &g));
        return cuda::graph(g);
    }

    //! A run of calls under one guard, on stream `on`: captured, one conditional node whose body
    //! is the calls (on a stream of its own); eager, the flag read on the host, taking the same
    //! decision. The run's waits are made before it and its events recorded after it, outside
    //! the node (a body may not wait for work outside it).
    void execute_guarded(std::span<const detail::bound_call> run, std::size_t first, cudaStream_t on, int& running, bool capturing) {
        const stage_guard& guard = *run.front().guard;
        running = int(first);
        for (const detail::bound_call& c : run) wait(c.waits, on);
        auto body = [&](cudaStream_t s) {
            for (std::size_t k = 0; k < run.size(); ++k) {
                running = int(first + k);
                scope_label label(run[k].name);
                call(run[k], s, capturing);
            }
        };
        if (capturing) {
            if (!body_stream_) body_stream_.emplace();
            scope_label label(run.front().name);
            cuda::conditional_node node(on, body_stream_->get(),
                                        guard.kind == guard_kind::while_holds ? cuda::conditional_kind::while_holds : cuda::conditional_kind::if_holds,
                                        guard.flag(), detail::cuda_capture_mode(mode_));
            body(body_stream_->get());
            node.close();
            detail::count_one(counters_.conditional_nodes);
        } else if (doctor_) {
            // Watched: the body runs on the stream a capture gives it (forked and joined back), so
            // the doctor names a body that keeps using the stream around it instead; captured,
            // that work would land outside the conditional node and run on every replay.
            if (!body_stream_) body_stream_.emplace();
            if (!body_fork_) body_fork_.emplace(), body_join_.emplace();
            while (holds(guard, on)) {
                body_fork_->record(on);
                body_fork_->wait_on(body_stream_->get());
                body(body_stream_->get());
                body_join_->record(body_stream_->get());
                body_join_->wait_on(on);
                if (guard.kind != guard_kind::while_holds) break;
            }
        } else {
            while (holds(guard, on)) {
                body(on);
                if (guard.kind != guard_kind::while_holds) break;
            }
        }
        for (const detail::bound_call& c : run) record(c.record, on);
    }

    //! Eager: the guard's flag, read on the host once the work before it on `on` is done.
    bool holds(const stage_guard& guard, cudaStream_t on) {
        int value = 0;
        CAPSCOPE_CHECK(cudaMemcpyAsync(&value, guard.flag(), sizeof value, cudaMemcpyDeviceToHost, on));
        CAPSCOPE_CHECK(cudaStreamSynchronize(on));
        detail::count_one(counters_.guard_reads);
        return value != 0;
    }

    //! A stream still capturing after the origin's capture ended (an invalidated capture leaves
    //! them so): end its capture too.
    void end_side_captures(std::span<const detail::bound_call> calls) noexcept {
        for_each_side_stream(calls, [](cudaStream_t side) {
            cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
            if (cudaStreamIsCapturing(side, &st) != cudaSuccess || st == cudaStreamCaptureStatusNone) return;
            cudaGraph_t partial = nullptr;
            detail::clear_own(cudaStreamEndCapture(side, &partial));
            if (partial) cudaGraphDestroy(partial);
        });
    }

    template <class F>
    void for_each_side_stream(std::span<const detail::bound_call> calls, F&& f) noexcept {
        lanes_.for_each_stream(f);
        if (body_stream_) f(body_stream_->get());
        for (const detail::bound_call& c : calls)
            for (stream_handle s : c.forks_to) f(s);
    }

    static bool capture_rule_error(const std::exception& e, cudaStreamCaptureStatus status_at_failure) {
        if (status_at_failure == cudaStreamCaptureStatusInvalidated) return true; // a forbidden call broke the capture
        const auto* ce = dynamic_cast<const cuda::error*>(&e);
        return ce && ce->which() == cuda::library::cuda && detail::is_capture_rule_code(ce->code());
    }
    //! The failing call left its error in CUDA's last-error state, and the exception reports it:
    //! clear that one (or a capture error), and leave any other for its owner to find.
    static void forget_reported_error(const std::exception& e) noexcept {
        const cudaError_t pending = cudaPeekAtLastError();
        const auto* ce = dynamic_cast<const cuda::error*>(&e);
        if (pending != cudaSuccess && (detail::is_capture_rule_code(pending) || (ce && ce->code() == int(pending)))) (void)cudaGetLastError();
    }

    capture_mode mode_;
    capture_failure policy_;
    detail::capture_doctor* doctor_ = nullptr; //!< set for the last eager warmup step only
    scratch_pool scratch_;
    lane_streams lanes_;
    std::vector<cuda::event> events_; //!< the plan's events (capscope/plan/plan_calls.hpp)
    runner_counters counters_;
    std::string last_failure_;
    std::uint32_t forked_here_ = 0; //!< lanes forked by the execution in progress
    std::chrono::steady_clock::time_point capture_started_;
    std::optional<cuda::stream> body_stream_; //!< captures conditional nodes' bodies (created at the first)
    std::optional<cuda::event> body_fork_, body_join_; //!< a watched eager body on body_stream_ (created at the first)
    std::optional<cuda::stream> update_stream_; //!< records calls updated in the graph (created at the first)
    std::optional<cuda::event> update_fork_, update_join_; //!< a watched eager updated call on update_stream_
    std::vector<detail::updated_node> captured_updates_; //!< met by the capture in progress
    const detail::bound_call* capture_first_ = nullptr;   //!< the first call of the capture in progress
    std::optional<cudaStream_t> previous_; //!< the stream of the last step or run (none before the first)
    std::optional<cuda::event> handover_;  //!< orders a step after the last, on another stream (created at the first change)
    cudaGraphExecUpdateResult last_refusal_ = cudaGraphExecUpdateSuccess;
};

} // namespace capscope
