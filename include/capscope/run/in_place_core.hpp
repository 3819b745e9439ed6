#pragma once
//! @file
//! The machinery of `in_place_runner` (capscope/run/in_place_runner.hpp), not a template: the
//! recording, the plan, and the cursor that takes a trainer's marks as they come, opening and
//! closing segments, capturing, launching and updating their graphs, and refusing what differs.

#include <capscope/plan/recorded_program.hpp>
#include <capscope/run/runner.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace capscope {

class in_place_step;

namespace detail {

//! What the runner needs of its Config, held as values so that the per-step code (and the
//! trainer's functions that take an `in_place_step&`) is not a template.
struct in_place_settings {
    capture_scope scope;
    int warmup_steps = 0;
    capture_mode mode = capture_mode::per_thread;
    capture_failure on_failure = capture_failure::raise;
    bool doctor = true;
    void (*check)(const training_program&) = nullptr; //!< the Config's and the schemas' checks of a program
};

//! Whether a recorded stage's name is the one a mark gives (or would derive), without allocating.
inline bool same_name(std::string_view recorded, const marked_region& m) {
    if (!m.name.empty()) return recorded == m.name;
    if (m.layer < 0) return recorded == m.kind.name;
    char digits[16];
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, m.layer);
    const std::string_view layer(digits, std::size_t(end - digits));
    return recorded.size() == 5 + layer.size() + 1 + m.kind.name.size() && recorded.starts_with("layer") &&
           recorded.substr(5, layer.size()) == layer && recorded[5 + layer.size()] == '.' && recorded.ends_with(m.kind.name);
}

class in_place_core {
public:
    using composer = std::function<training_program(training_program)>;

    in_place_core(in_place_settings settings, std::vector<layer_buffers> layers, layer_buffers outside, composer compose)
        : settings_(settings), layers_(std::move(layers)), outside_(std::move(outside)), compose_(std::move(compose)),
          executor_(settings.mode, settings.on_failure) {}
    in_place_core(const in_place_core&) = delete;
    in_place_core& operator=(const in_place_core&) = delete;
    ~in_place_core() {
        abandon();
        release_graphs();
    }

    //! The pass of its own that records without running the regions' code (needed with a composer).
    template <class Body>
    void record(Body&& body);

    //! Which step is current: an in_place_step of an earlier one may no longer act.
    unsigned long generation() const noexcept { return generation_; }

    void begin(cudaStream_t s) {
        if (in_step_) abandon(); // the last step stopped by an exception, or its in_place_step was kept
        ++generation_;
        if (!program_) {
            if (compose_)
                throw std::logic_error("capscope: an in_place_runner with a composer records in a pass of its own, before the first step "
                                       "(its hooks cannot run in a step that is being recorded) -- fix: call record(body) once first, "
                                       "with body making the marks of one step");
            recording_ = true;
            recorder_ = program_recorder{};
        }
        if (!recording_ && plan_.graph_count > 0) detail::require_capturable_stream(s);
        executor_.follow_previous_step(s);
        s_ = s;
        in_step_ = true;
        microbatch_ = -1;
        cursor_ = 0;
        open_ = -1;
        previous_scratch_ = active_scratch;
        active_scratch = &executor_.scratch();
        if (recording_) return;
        if (!warmup_started_) {
            warmup_started_ = true;
            run_warmup_hooks(true);
            if (plan_.warmup_steps == 0) run_warmup_hooks(false);
        }
        executor_.prepare_events(plan_.events.size());
        replaying_ = plan_.scope.impl != graph_impl::eager && warm_steps_ >= plan_.warmup_steps;
        watched_ = settings_.doctor && plan_.scope.impl != graph_impl::eager && plan_.warmup_steps >= 2 &&
                   warm_steps_ + 1 == plan_.warmup_steps && start_doctor();
    }

    void begin_microbatch() {
        require_step("microbatch()");
        if (recording_) return recorder_.begin_microbatch();
        ++microbatch_;
    }

    template <class F>
    void arrive(bool step_level, phase pass, const marked_region& m, F& fn) {
        require_step(step_level ? "run()" : pass == phase::forward ? "forward()" : "backward()");
        if (recording_) {
            if (step_level) recorder_.mark_step_level(m);
            else recorder_.mark(pass, m);
            if (!dry_ && holds_when_recording(m.guard)) {
                scope_label label(m.name.empty() ? m.kind.name : m.name);
                fn(s_);
            }
            return;
        }
        leave_gap();
        const int c = next_trainer_[std::size_t(cursor_)];
        const step_part part = !step_level ? step_part::microbatch : microbatch_ < 0 ? step_part::step_begin : step_part::step_end;
        check_arrival(c, part, pass, m);
        advance_to(c);
        open_for(c);
        check_gap_in_capture(c);
        region_slot& slot = *slot_of_call_[std::size_t(c)];
        struct clear_slot {
            region_slot& s;
            ~clear_slot() { s.callable = nullptr, s.invoke = nullptr; }
        } clear{slot};
        slot.callable = static_cast<const void*>(&fn);
        slot.invoke = [](const void* f, stream_handle s) { (*static_cast<F*>(const_cast<void*>(f)))(s); };
        if (mode_ == segment_mode::replayed && calls_[std::size_t(c)].updated) update_in_graph(c);
        run_calls(c, c + 1);
        cursor_ = c + 1;
        const int seg_end = segment_end(open_);
        run_calls(cursor_, std::min(next_trainer_[std::size_t(cursor_)], seg_end));
        cursor_ = std::min(next_trainer_[std::size_t(cursor_)], seg_end);
        if (cursor_ == seg_end) close_open();
        else enter_gap(c);
    }

    void end() {
        require_step("end()");
        if (recording_) {
            const bool ran = !dry_; // a step that ran counts; a pass of its own does not
            finish_recording();
            if (ran) detail::count_one(executor_.counters().steps);
            return;
        }
        leave_gap();
        const int left = next_trainer_[std::size_t(cursor_)];
        if (left < int(calls_.size())) {
            const stage& st = stage_of(program_->program, plan_.calls[std::size_t(left)]);
            abandon();
            throw std::logic_error("capscope: the step ended before region '" + st.name + "' (" + describe_call(left) +
                                   "), which the recorded step has -- fix: mark every recorded region in every step, or call "
                                   "record_again() before a step whose regions change");
        }
        advance_to(int(calls_.size()));
        close_open();
        executor_.wait(plan_.waits_of(plan_.end_waits), s_);
        finish_step();
        detail::count_one(executor_.counters().steps);
        if (watched_) act_on_findings(*doctor_, plan_, calls_, graphs_.run_eagerly, executor_.counters(), settings_.on_failure);
        if (warm_steps_ < plan_.warmup_steps && ++warm_steps_ == plan_.warmup_steps) run_warmup_hooks(false);
    }

    //! Ends a step that stopped midway (an exception): a capture in progress is ended and its
    //! partial graph destroyed; the next step starts from the beginning.
    void abandon() noexcept {
        if (!in_step_) return;
        if (open_ >= 0 && mode_ == segment_mode::capturing) {
            const plan_segment& seg = plan_.segments[std::size_t(open_)];
            executor_.abort_capture(segment_calls(seg), on_);
        }
        open_ = -1;
        finish_step();
    }

    void record_again() noexcept {
        abandon();
        release_graphs();
        program_.reset();
        recording_ = false;
        warm_steps_ = 0;
        warmup_started_ = false;
    }

    bool recorded() const noexcept { return bool(program_); }
    const training_plan& plan() const { return require_recorded(), plan_; }
    const training_program& program() const { return require_recorded(), program_->program; }
    const runner_counters& counters() const noexcept { return executor_.counters(); }
    const std::string& last_failure() const noexcept { return executor_.last_failure(); }
    int graphs_alive() const { return graphs_.alive(); }
    int graphs_run_eagerly() const { return graphs_.left_eager(); }

private:
    enum class segment_mode { eager, capturing, replayed };

    //! The recorded program, on the heap: the bound calls point into its stages.
    struct recorded_program {
        training_program program;     //!< as composed: what is planned and run
        training_program as_recorded; //!< the marks' own stages: what later steps' marks are held against
    };

    //! A guarded region in the step being recorded runs as an eager guarded stage does: when its
    //! flag, read on the host once the work before it is done, holds (run_while is refused).
    bool holds_when_recording(const stage_guard& g) const {
        if (!g) return true;
        int value = 0;
        CAPSCOPE_CHECK(cudaMemcpyAsync(&value, g.flag(), sizeof value, cudaMemcpyDeviceToHost, s_));
        CAPSCOPE_CHECK(cudaStreamSynchronize(s_));
        return value != 0;
    }

    void require_step(const char* what) const {
        if (!in_step_)
            throw std::logic_error(std::string("capscope: in_place_step::") + what + " outside a step (before step(), after end(), or after "
                                   "the step stopped at an exception) -- fix: begin each step with in_place_runner::step(stream)");
    }
    void require_recorded() const {
        if (!program_) throw std::logic_error("capscope: nothing is recorded yet -- fix: run a step (or record(body)) first");
    }

    void finish_recording() {
        recording_ = false;
        in_step_ = false;
        active_scratch = previous_scratch_;
        training_program p = recorder_.finish(layers_, outside_);
        training_program as_recorded = p;
        if (compose_) p = compose_(std::move(p));
        if (p.rerun)
            throw plan_error("P18", "", "the composed program may refuse a step (training_program::rerun), and a refused step runs every call "
                             "again, which the trainer's own code would have to do", "declare the stages (a training_program) for a step "
                             "the device may refuse");
        if (settings_.check) settings_.check(p);
        auto owned = std::make_unique<recorded_program>(recorded_program{std::move(p), std::move(as_recorded)});
        training_plan plan = make_training_plan(settings_.scope, settings_.warmup_steps, owned->program);
        program_ = std::move(owned);
        plan_ = std::move(plan);
        calls_ = bind_calls(plan_, program_->program);
        graphs_.resize(std::size_t(plan_.graph_count));
        graph_nccl_ = collectives_of(plan_, calls_).graphs;
        // Per call: its segment, its slot (a trainer's region) or none (capscope's own), the next region.
        seg_of_call_.assign(calls_.size(), -1);
        for (std::size_t i = 0; i < plan_.segments.size(); ++i)
            for (int k = 0; k < plan_.segments[i].call_count; ++k) seg_of_call_[std::size_t(plan_.segments[i].first_call + k)] = int(i);
        slot_of_call_.assign(calls_.size(), nullptr);
        recorded_stage_of_call_.assign(calls_.size(), nullptr);
        for (std::size_t c = 0; c < calls_.size(); ++c) {
            const stage_call& pc = plan_.calls[c];
            const stage& st = stage_of(program_->program, pc);
            if (st.added) continue;
            // The stage as marked, before a composition added to its buffers (offload's copies).
            for (const stage& r : stage_list(program_->as_recorded, pc.part, pc.microbatch))
                if (r.name == st.name) recorded_stage_of_call_[c] = &r;
            const std::string key = (pc.part == step_part::step_begin ? "begin:"
                                     : pc.part == step_part::step_end ? "end:"
                                     : pc.direction == phase::forward ? "forward:"
                                                                        : "backward:") +
                                    st.name;
            slot_of_call_[c] = recorder_.slot(key);
        }
        next_trainer_.assign(calls_.size() + 1, int(calls_.size()));
        for (int c = int(calls_.size()) - 1; c >= 0; --c)
            next_trainer_[std::size_t(c)] = slot_of_call_[std::size_t(c)] ? c : next_trainer_[std::size_t(c + 1)];
        skip_replays_ = installed_breakage().skip_in_place_replays;
        // A step recorded as it ran is the first warmup step (no composer: no warmup hooks either).
        warm_steps_ = dry_ ? 0 : 1;
        warmup_started_ = !dry_;
    }

    std::string describe_call(int c) const {
        const stage_call& pc = plan_.calls[std::size_t(c)];
        return std::string(phase_name(pc.direction)) +
               (pc.part == step_part::microbatch ? ", microbatch " + std::to_string(pc.microbatch)
                : pc.part == step_part::step_begin ? ", before the microbatches"
                                                   : ", after the microbatches");
    }

    //! The mark the trainer's code reached must be the recorded one, on the same buffers (no
    //! allocation unless it is not: this runs at every region of every step).
    void check_arrival(int c, step_part part, phase pass, const marked_region& m) {
        const stage_call* pc = c < int(calls_.size()) ? &plan_.calls[std::size_t(c)] : nullptr;
        const stage* st = pc ? &stage_of(program_->program, *pc) : nullptr;
        const bool same_region = pc && pc->part == part && pc->direction == pass && (part != step_part::microbatch || pc->microbatch == microbatch_) &&
                                 st->layer == m.layer && st->kind.name == m.kind.name && same_name(st->name, m);
        auto same_list = [](const std::vector<tensor_ref>& recorded, list_view<tensor_ref> now) {
            if (recorded.size() != now.size()) return false;
            for (std::size_t i = 0; i < recorded.size(); ++i)
                if (!(recorded[i] == now.span()[i])) return false;
            return true;
        };
        const bool backward = pass == phase::backward;
        if (same_region) st = recorded_stage_of_call_[std::size_t(c)]; // its buffers as marked, before a composition added to them
        const bool same_reads = same_region && same_list(backward ? st->backward_inputs : st->inputs, m.reads);
        const bool same_writes = same_region && same_list(backward ? st->backward_outputs : st->outputs, m.writes);
        if (same_reads && same_writes) return;
        const std::string reached = "the trainer's code reached region '" + (m.name.empty() ? default_region_name(m) : std::string(m.name)) +
                                    "' (" + std::string(phase_name(pass)) +
                                    (part == step_part::microbatch ? ", microbatch " + std::to_string(microbatch_)
                                     : part == step_part::step_begin ? ", before the microbatches"
                                                                     : ", after the microbatches") +
                                    ")";
        const std::string what = !pc           ? reached + ", but the recorded step has no more regions"
                                 : !same_region ? reached + ", where the recorded step has '" + st->name + "' (" + describe_call(c) + ")"
                                                : reached + ", and its " + (same_reads ? "writes" : "reads") + " are not the recorded ones (" +
                                                      std::to_string((same_reads ? m.writes : m.reads).size()) + " now, " +
                                                      std::to_string((same_reads ? (backward ? st->backward_outputs : st->outputs)
                                                                                 : (backward ? st->backward_inputs : st->inputs))
                                                                         .size()) +
                                                      " recorded, or at other addresses): a graph would use the recorded ones";
        const long step = executor_.counters().steps + 1;
        const std::string ran = open_ >= 0 && mode_ == segment_mode::replayed && launched_
                                    ? "; graph g" + std::to_string(plan_.segments[std::size_t(open_)].graph) +
                                          ", which holds the regions before it, had been launched, so the recorded work of all its regions "
                                          "has run this step: restore the model's state before another step"
                                    : "";
        abandon();
        throw std::logic_error("capscope: step " + std::to_string(step) + ": " + what + ran +
                               " -- fix: make every step's marks as the recorded step made them, or call record_again() before a step whose "
                               "regions change (its graphs are captured again after the warmup)");
    }

    int segment_end(int si) const {
        const plan_segment& seg = plan_.segments[std::size_t(si)];
        return seg.first_call + seg.call_count;
    }
    std::span<const bound_call> segment_calls(const plan_segment& seg) const {
        return {calls_.data() + seg.first_call, std::size_t(seg.call_count)};
    }

    //! Runs capscope's own calls up to (not including) call `c`, opening and closing segments.
    void advance_to(int c) {
        while (cursor_ < c) {
            const int si = seg_of_call_[std::size_t(cursor_)];
            if (open_ != si) {
                close_open();
                open_segment(si);
            }
            const int e = std::min(c, segment_end(si));
            run_calls(cursor_, e);
            cursor_ = e;
            if (cursor_ == segment_end(si)) close_open();
        }
    }
    void open_for(int c) {
        const int si = seg_of_call_[std::size_t(c)];
        if (open_ == si) return;
        close_open();
        open_segment(si);
    }

    void open_segment(int si) {
        const plan_segment& seg = plan_.segments[std::size_t(si)];
        on_ = seg.lane ? executor_.lanes().fork(seg.lane, s_) : s_;
        executor_.wait(plan_.waits_of(seg.waits), on_);
        open_ = si;
        last_region_in_open_ = -1;
        const bool graphed = seg.graphed && !graphs_.run_eagerly[std::size_t(seg.graph)];
        if (replaying_ && graphed) {
            if (graphs_.execs[std::size_t(seg.graph)]) {
                mode_ = segment_mode::replayed;
                // A graph with regions updated in the graph is launched when the segment closes: they
                // are recorded again as the trainer's code reaches them (the code between is host
                // work). Any other is launched now, so the device starts while the host goes on.
                launched_ = graphs_.updates[std::size_t(seg.graph)].empty();
                if (launched_) launch_open();
                return;
            }
            mode_ = segment_mode::capturing;
            try {
                executor_.begin_capture(on_, calls_.data() + seg.first_call);
            } catch (const std::exception& e) {
                fail_capture(e, cudaStreamCaptureStatusNone, {});
            }
            return;
        }
        if (watched_) doctor_->segment(graphed);
        executor_.watch_with(watched_ ? doctor_.get() : nullptr);
        executor_.open_eager();
        mode_ = segment_mode::eager;
    }

    void close_open() {
        if (open_ < 0) return;
        const plan_segment& seg = plan_.segments[std::size_t(open_)];
        if (mode_ == segment_mode::eager) {
            executor_.close_eager(on_, calls_[std::size_t(seg.first_call)].name);
        } else if (mode_ == segment_mode::capturing) {
            cuda::graph g;
            try {
                g = executor_.end_capture(segment_calls(seg), on_);
            } catch (const std::exception& e) {
                fail_capture(e, segment_executor::capture_status(on_), {});
            }
            mode_ = segment_mode::eager; // ended: nothing to abort if what follows throws
            const std::size_t at = std::size_t(seg.graph);
            graphs_.updates[at] = executor_.take_captured_updates();
            g = executor_.launchable(std::move(g), !graphs_.updates[at].empty());
            executor_.apply(graphs_.execs[at], g, calls_[std::size_t(seg.first_call)].name);
            if (!graphs_.updates[at].empty()) graphs_.kept[at] = std::move(g); // its child nodes are updated through it
            if (graph_nccl_[at]) {
                nccl_order_.captured();
                nccl_order_.launch(graphs_.execs[at], on_); // (NCCL's rules without graph mixing)
            } else graphs_.execs[at].launch(on_);
            detail::count_one(executor_.counters().replays);
        } else if (mode_ == segment_mode::replayed && !launched_) {
            launch_open();
        }
        executor_.record(seg.record, on_);
        open_ = -1;
    }

    void launch_open() {
        const plan_segment& seg = plan_.segments[std::size_t(open_)];
        if (!skip_replays_) { // (a test may break it on purpose)
            const cuda::graph_exec& exec = graphs_.execs[std::size_t(seg.graph)];
            if (graph_nccl_[std::size_t(seg.graph)]) nccl_order_.launch(exec, on_); // (NCCL's rules without graph mixing)
            else exec.launch(on_);
        }
        detail::count_one(executor_.counters().replays);
        launched_ = true;
    }

    //! A region updated in the graph, reached in a segment whose graph is about to be launched:
    //! recorded again now, with this step's values, and put in place.
    void update_in_graph(int c) {
        const plan_segment& seg = plan_.segments[std::size_t(open_)];
        const std::size_t g = std::size_t(seg.graph);
        for (const updated_node& u : graphs_.updates[g]) {
            if (u.call != c - seg.first_call) continue;
            std::string why;
            const std::string_view refused = executor_.refresh_one(graphs_.execs[g], u, calls_[std::size_t(c)], why);
            if (refused.empty()) return;
            const segment_site where = site_of(plan_, program_->program, seg);
            if (settings_.on_failure == capture_failure::run_eagerly) {
                graphs_.run_eagerly[g] = 1;
                detail::count_one(executor_.counters().update_fallbacks);
            }
            open_ = -1;
            finish_step();
            capture_failed f("capscope: updating " + where.where + " failed at region '" + std::string(refused) + update_refusal(why) +
                                 "\n  fix: keep the region's kernels and its number of launches the same every step (their arguments, grid "
                                 "and block sizes may change)" +
                                 (settings_.on_failure == capture_failure::run_eagerly ? "; the graph stays eager from the next step on" : ""),
                             std::string(refused), where.layer, where.graph, where.index);
            f.set_step_progress("this step stopped there: graph g" + std::to_string(seg.graph) + " had not been launched, so its regions "
                                "before this one had not run either; restore the model's state before another step");
            throw f;
        }
    }

    //! Calls [a, b) of the open segment: run, captured, or nothing (its graph is launched at its close).
    void run_calls(int a, int b) {
        if (a >= b || mode_ == segment_mode::replayed) return;
        const plan_segment& seg = plan_.segments[std::size_t(open_)];
        const std::span<const bound_call> part{calls_.data() + a, std::size_t(b - a)};
        int running = -1;
        if (mode_ == segment_mode::eager) {
            if (std::none_of(part.begin(), part.end(), [](const bound_call& c) { return c.collective; }))
                return executor_.execute_part(part, on_, seg.lane, running, false);
            return nccl_order_.eager(on_, [&] { executor_.execute_part(part, on_, seg.lane, running, false); });
        }
        try {
            executor_.execute_part(part, on_, seg.lane, running, true);
        } catch (const std::exception& e) {
            const cudaStreamCaptureStatus status = segment_executor::capture_status(on_);
            executor_.abort_capture(segment_calls(seg), on_);
            fail_capture(e, status, running >= 0 ? part[std::size_t(running)].name : std::string_view());
        }
    }

    //! A capture failed (its capture already ended): the graph stays eager under run_eagerly, and
    //! the step stops here either way (the regions before the failure in this graph were captured,
    //! not run, and their code has returned).
    [[noreturn]] void fail_capture(const std::exception& e, cudaStreamCaptureStatus status, std::string_view running) {
        const plan_segment seg = plan_.segments[std::size_t(open_)];
        open_ = -1;
        const std::string progress = "this step stopped there: the work before graph g" + std::to_string(seg.graph) +
                                     " had run, the rest had not; restore the model's state before another step";
        try {
            executor_.failed_capture(e, status, running, site_of(plan_, program_->program, seg));
        } catch (capture_failed& f) {
            finish_step();
            f.set_step_progress(progress);
            throw;
        } catch (...) {
            finish_step();
            throw;
        }
        // run_eagerly: the graph stays eager from the next step on
        graphs_.run_eagerly[std::size_t(seg.graph)] = 1;
        finish_step();
        capture_failed f(executor_.last_failure() + "\n  the graph stays eager from the next step on (capture_failure::run_eagerly)",
                         std::string(running), seg.layer, seg.graph, seg.microbatch);
        f.set_step_progress(progress);
        throw f;
    }

    //! Between two regions of one graph: the doctor watches the trainer's code (the watched step),
    //! or the capture's node count is kept to compare at the next region (a capturing step).
    void enter_gap(int c) {
        const plan_segment& seg = plan_.segments[std::size_t(open_)];
        last_region_in_open_ = c;
        if (mode_ == segment_mode::capturing) {
            gap_nodes_ = captured_nodes();
        } else if (mode_ == segment_mode::eager && watched_ && seg.graphed && !graphs_.run_eagerly[std::size_t(seg.graph)]) {
            const int next = next_trainer_[std::size_t(cursor_)];
            gap_label_ = "between '" + stage_of(program_->program, plan_.calls[std::size_t(c)]).name + "' and '" +
                         stage_of(program_->program, plan_.calls[std::size_t(next)]).name + "' (graph g" + std::to_string(seg.graph) + ")";
            doctor_->enter_gap(gap_label_, calls_[std::size_t(c)].call);
            in_gap_ = true;
        }
    }
    void leave_gap() {
        if (!in_gap_) return;
        doctor_->leave();
        in_gap_ = false;
    }
    void check_gap_in_capture(int c) {
        if (mode_ != segment_mode::capturing || last_region_in_open_ < 0) return;
        if (captured_nodes() == gap_nodes_) return;
        const plan_segment seg = plan_.segments[std::size_t(open_)];
        const std::string& before = stage_of(program_->program, plan_.calls[std::size_t(last_region_in_open_)]).name;
        const std::string& after = stage_of(program_->program, plan_.calls[std::size_t(c)]).name;
        executor_.abort_capture(segment_calls(seg), on_);
        executor_.scratch().begin_segment(false); // forget the failed segment's scratch, as failed_capture does
        open_ = -1;
        detail::count_one(executor_.counters().capture_failures);
        if (settings_.on_failure == capture_failure::run_eagerly) graphs_.run_eagerly[std::size_t(seg.graph)] = 1;
        finish_step();
        capture_failed f("capscope: capturing " + site_of(plan_, program_->program, seg).where + " failed: the trainer's code between regions '" +
                             before + "' and '" + after + "' enqueued CUDA work while graph g" + std::to_string(seg.graph) +
                             " was being captured: it would be replayed with the graph and run again by the trainer after it, out of order"
                             "\n  the capture was ended and its partial graph destroyed; the streams are usable"
                             "\n  fix: mark that code as a region of its own (it then joins the graph in its place), or move it before '" +
                             before + "' or after the graph's last region" +
                             (settings_.on_failure == capture_failure::run_eagerly ? "; the graph stays eager from the next step on" : ""),
                         after, seg.layer, seg.graph, seg.microbatch);
        f.set_step_progress("this step stopped there: the work before graph g" + std::to_string(seg.graph) +
                            " had run, the rest had not; restore the model's state before another step");
        throw f;
    }
    //! Nodes in the graph being captured on the open segment's stream (-1: not capturing any more).
    long captured_nodes() const {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t graph = nullptr;
        if (cudaStreamGetCaptureInfo(on_, &status, nullptr, &graph) != cudaSuccess || status != cudaStreamCaptureStatusActive || !graph) {
            (void)cudaGetLastError();
            return -1;
        }
        std::size_t n = 0;
        if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        return long(n);
    }

    bool start_doctor() { return detail::start_doctor(doctor_, settings_.mode); }

    void finish_step() noexcept {
        if (!in_step_) return;
        in_step_ = false;
        if (in_gap_) doctor_->leave(), in_gap_ = false;
        executor_.watch_with(nullptr);
        if (doctor_) doctor_->stop();
        active_scratch = previous_scratch_;
    }

    void release_graphs() noexcept { executor_.release(graphs_.release()); }
    void run_warmup_hooks(bool before) {
        const warmup_work& w = program_->program.warmup;
        if (w.run) w.run(w.pipeline, before, s_);
    }

    in_place_settings settings_;
    std::vector<layer_buffers> layers_;
    layer_buffers outside_;
    composer compose_;
    segment_executor executor_;
    program_recorder recorder_;
    std::unique_ptr<recorded_program> program_;
    training_plan plan_;
    std::vector<bound_call> calls_;
    std::vector<int> seg_of_call_, next_trainer_;
    std::vector<region_slot*> slot_of_call_;
    std::vector<const stage*> recorded_stage_of_call_; //!< into program_->as_recorded
    training_graphs graphs_;
    std::vector<unsigned char> graph_nccl_; //!< per graph: whether it makes collective calls (cuda/nccl_graph_mixing.hpp)
    cuda::nccl_launch_order nccl_order_;
    std::unique_ptr<capture_doctor> doctor_;
    std::string gap_label_;
    scratch_pool* previous_scratch_ = nullptr;
    cudaStream_t s_ = nullptr, on_ = nullptr;
    int cursor_ = 0, open_ = -1, microbatch_ = -1, warm_steps_ = 0, last_region_in_open_ = -1;
    long gap_nodes_ = 0;
    unsigned long generation_ = 0;
    segment_mode mode_ = segment_mode::eager;
    bool skip_replays_ = false; //!< broken on purpose (detail::breakage)
    bool launched_ = false;     //!< the open replayed segment's graph has been launched
    bool in_step_ = false, recording_ = false, dry_ = false, replaying_ = false, watched_ = false, in_gap_ = false, warmup_started_ = false;
};

} // namespace detail

} // namespace capscope
