// Zero overhead, composed: tutorial 11's trainer (examples/11_composed_trainer) with a gather hook
// on lane 1, a gradient-clamp hook on lane 4 and its own activations offloaded on lanes 2 and 3,
// run by capscope's runners and by hand-written code that does the same work with raw CUDA
// calls: per-block graphs launched on the same streams with the events an expert would place,
// and one hand-captured whole-step graph. Variants run round-robin in one process; per step it
// reports the device time, the host time, and the CUDA API calls by function (CUPTI). Before
// timing, every variant's weights after 4 steps are checked bit for bit against the model's
// own one-stream loop.
//
//   composed_overhead [--rounds R] [--steps-per-round K] [--markdown FILE] [--csv FILE]

#include "api_counter.hpp"
#include "arguments.hpp"
#include "figures_csv.hpp"
#include "round_robin.hpp"

#include "../examples/11_composed_trainer/block_stack.hpp"

#include <capscope/capscope.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/stream.hpp>
#include <capscope/engine.hpp>
#include <capscope/hooks.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace capscope;
using bench::median;

using own_offload = offload<offload_tensors<"pre_act", "hidden">, min_offloaded_tensor_size<1>>;
using local_cfg = config<impl::lazy_per_layer, capture_regions<"up", "down">, own_offload, warmup_steps<2>>;
using te_cfg = config<impl::ahead_of_time_per_layer, capture_regions<"up", "down">, own_offload, warmup_steps<2>>;
using full_cfg = config<impl::whole_iteration, no_nan_check, own_offload, warmup_steps<2>>;

struct variant {
    variant(std::string n, std::function<void(cudaStream_t)> f) : name(std::move(n)), step(std::move(f)) {}
    std::string name;
    std::function<void(cudaStream_t)> step;
    std::vector<float> device_ms, host_us;
    bench::api_calls api;
};

//! The composed step by hand: what the runner's plan does, written with raw CUDA calls. Block l's
//! activations are copied out (l < blocks - 2) on lane 2 + l % 2 as branches of its forward graph,
//! and back after the backward of block l + 2 (which frees the slot); the gather runs on lane 1
//! ahead of each forward, the clamp on lane 4 after each backward, and SGD waits for the last clamp.
class hand_composed {
public:
    hand_composed(composed::block_stack& m, bool whole) : m_(m), whole_(whole), blocks_(m.dims().blocks) {
        for (int l = 0; l < blocks_; ++l)
            if (copied(l)) host_.emplace_back(2 * m.activation_bytes());
        back_done_.resize(std::size_t(blocks_));
        copied_out_.resize(std::size_t(blocks_));
    }
    void step(cudaStream_t s) {
        if (whole_) {
            if (!whole_exec_) {
                whole_exec_ = cuda::graph_exec(cuda::capture(s, [&](cudaStream_t st) { issue(st, false); }));
            }
            whole_exec_.launch(s);
            return;
        }
        if (fwd_.empty()) capture_blocks(s);
        issue(s, true);
    }

private:
    bool copied(int l) const { return l < blocks_ - 2; }
    cudaStream_t copy_lane(int l) const { return lanes_[std::size_t(2 + l % 2)]; }
    void* host_of(int l, bool hidden) const { return host_[std::size_t(l)].data() + (hidden ? m_.activation_bytes() : 0); }

    void to_host(int l, cudaStream_t lane) {
        CAPSCOPE_CHECK(cudaMemcpyAsync(host_of(l, false), m_.pre_act(l), m_.activation_bytes(), cudaMemcpyDeviceToHost, lane));
        CAPSCOPE_CHECK(cudaMemcpyAsync(host_of(l, true), m_.hidden_act(l), m_.activation_bytes(), cudaMemcpyDeviceToHost, lane));
    }
    void to_device(int l, cudaStream_t lane) {
        CAPSCOPE_CHECK(cudaMemcpyAsync(m_.hidden_act(l), host_of(l, true), m_.activation_bytes(), cudaMemcpyHostToDevice, lane));
        CAPSCOPE_CHECK(cudaMemcpyAsync(m_.pre_act(l), host_of(l, false), m_.activation_bytes(), cudaMemcpyHostToDevice, lane));
    }
    //! Block l's forward: up, its copies out forked onto the copy lane, down. A graph of its own
    //! joins them at its end; inside the whole-step graph they run on until block l + 2's up
    //! overwrites their slot, which waits for them there.
    void forward(int l, cudaStream_t s) {
        composed::block_stack::block_fns f{&m_, l};
        if (whole_ && l >= 2 && copied(l - 2)) copied_out_[std::size_t(l - 2)].wait_on(s);
        f.up_forward(s);
        if (copied(l)) {
            fork_.record(s);
            fork_.wait_on(copy_lane(l));
            to_host(l, copy_lane(l));
            copied_out_[std::size_t(l)].record(copy_lane(l));
        }
        f.down_forward(s);
        if (copied(l) && !whole_) copied_out_[std::size_t(l)].wait_on(s);
    }
    void backward(int l, cudaStream_t s) {
        composed::block_stack::block_fns f{&m_, l};
        f.down_backward(s);
        f.up_backward(s);
    }
    //! Side-lane work after what `s` has issued so far: fork, then `work` on `lane`.
    template <class Work>
    void on_lane(cudaStream_t s, cudaStream_t lane, Work&& work) {
        fork_.record(s);
        fork_.wait_on(lane);
        work(lane);
    }

    void capture_blocks(cudaStream_t s) {
        for (int l = 0; l < blocks_; ++l) {
            const int b = l;
            gather_.emplace_back(cuda::capture(lanes_[1], [&](cudaStream_t st) { m_.gather(b, st); }));
            fwd_.emplace_back(cuda::capture(s, [&](cudaStream_t st) { forward(b, st); }));
            bwd_.emplace_back(cuda::capture(s, [&](cudaStream_t st) { backward(b, st); }));
            clip_.emplace_back(cuda::capture(lanes_[4], [&](cudaStream_t st) { m_.clip_gradients(b, st); }));
            back_.emplace_back(copied(l) ? cuda::graph_exec(cuda::capture(copy_lane(l), [&](cudaStream_t st) { to_device(b, st); }))
                                         : cuda::graph_exec());
        }
    }
    //! One step: per-block graph launches (`graphs`), or the same work as direct calls (captured whole).
    void issue(cudaStream_t s, bool graphs) {
        // Block l's graph of one kind, launched; or, captured whole, the work itself.
        auto run = [&](const std::vector<cuda::graph_exec>& of_kind, int l, cudaStream_t st, auto&& direct) {
            if (graphs) of_kind[std::size_t(l)].launch(st);
            else direct(st);
        };
        m_.zero_grads(s);
        for (int l = 0; l < blocks_; ++l) {
            on_lane(s, lanes_[1], [&](cudaStream_t lane) { run(gather_, l, lane, [&](cudaStream_t st) { m_.gather(l, st); }); });
            gathered_.record(lanes_[1]);
            gathered_.wait_on(s);
            run(fwd_, l, s, [&](cudaStream_t st) { forward(l, st); });
        }
        m_.loss_forward(s);
        for (int l = blocks_ - 1; l >= 0; --l) {
            if (copied(l)) back_done_[std::size_t(l)].wait_on(s);
            run(bwd_, l, s, [&](cudaStream_t st) { backward(l, st); });
            on_lane(s, lanes_[4], [&](cudaStream_t lane) { run(clip_, l, lane, [&](cudaStream_t st) { m_.clip_gradients(l, st); }); });
            if (l >= 2 && copied(l - 2)) { // block l's backward freed the slot block l - 2 comes back to
                on_lane(s, copy_lane(l - 2), [&](cudaStream_t lane) {
                    run(back_, l - 2, lane, [&](cudaStream_t st) { to_device(l - 2, st); });
                });
                back_done_[std::size_t(l - 2)].record(copy_lane(l - 2));
            }
        }
        clipped_.record(lanes_[4]);
        clipped_.wait_on(s);
        m_.sgd(s);
    }

    composed::block_stack& m_;
    bool whole_;
    int blocks_;
    std::array<cuda::stream, 5> lanes_; // 1..4 used, as the runner's lanes
    cuda::event fork_, gathered_, clipped_;
    std::vector<cuda::event> back_done_, copied_out_;
    std::vector<cuda::pinned_buffer<std::byte>> host_;
    std::vector<cuda::graph_exec> gather_, fwd_, bwd_, clip_, back_;
    cuda::graph_exec whole_exec_;
};

//! Every variant over one model.
struct variants_of {
    explicit variants_of(composed::block_stack& m) : m_(m) {
        add_runner<local_cfg>("runner local, composed");
        add_runner<te_cfg>("runner transformer_engine, composed");
        auto by_hand = std::make_shared<hand_composed>(m, false), again = std::make_shared<hand_composed>(m, false);
        keep.push_back(by_hand);
        keep.push_back(again);
        v.emplace_back("hand-written per-block graphs, composed", [by_hand](cudaStream_t s) { by_hand->step(s); });
        v.emplace_back("hand-written per-block graphs, composed, 2nd copy", [again](cudaStream_t s) { again->step(s); });
        add_runner<full_cfg>("runner full_iteration, composed");
        auto whole = std::make_shared<hand_composed>(m, true);
        keep.push_back(whole);
        v.emplace_back("hand-written whole-step graph, composed", [whole](cudaStream_t s) { whole->step(s); });
    }
    template <class Config>
    void add_runner(std::string name) {
        auto gather = hook<hook_phase::forward_pre, capturable, on_lane<1>>(
            "gather", [m = &m_](forward_pre_context& c) { m->gather(c.layer(), c.stream()); });
        auto clip = hook<hook_phase::backward, capturable, on_lane<4>>("clip", [m = &m_](backward_context& c) { m->clip_gradients(c.layer(), c.stream()); });
        auto r = std::make_shared<runner<Config, layer_schemas<composed::block>>>(
            composition<Config>(m_.training_program()).hooks(hook_pipeline{gather, clip}, m_.layer_buffers()).offload(m_.store()).program());
        keep.push_back(r);
        v.emplace_back(std::move(name), [r](cudaStream_t s) { r->step(s); });
    }
    composed::block_stack& m_;
    std::vector<variant> v;
    std::vector<std::shared_ptr<void>> keep;
};

struct options {
    int rounds = 12, steps_per_round = 20;
    std::string markdown, csv;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string run(const options& o, bench::figures_csv& csv, cudaStream_t s) {
    const composed::shape sh;
    const offload_settings policy = te_cfg::normalized.offload;
    // Parity first: each variant, 4 steps from the same start, against the one-stream loop.
    composed::block_stack reference(sh, offload_settings{}, s);
    for (int i = 0; i < 4; ++i) reference.step_by_hand(s);
    const std::vector<float> want = reference.weights(s);
    std::string parity;
    bool all_same = true;
    for (std::size_t i = 0;; ++i) {
        composed::block_stack m(sh, policy, s);
        variants_of all(m);
        if (i >= all.v.size()) break;
        for (int k = 0; k < 4; ++k) all.v[i].step(s);
        const bool same = same_bits(m.weights(s), want);
        all_same = all_same && same;
        parity += "- " + all.v[i].name + ": " + (same ? "bitwise equal" : "DIFFERS") + "\n";
    }
    if (!all_same) throw std::runtime_error("a variant differs from the one-stream loop:\n" + parity);

    composed::block_stack m(sh, policy, s);
    variants_of all(m);
    auto& v = all.v;
    for (auto& x : v)
        for (int i = 0; i < 4; ++i) x.step(s); // warmup steps and captures
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    bench::time_round_robin(v, o.rounds, o.steps_per_round, s);
    bench::api_counter counter;
    for (auto& x : v) {
        x.api = counter.count([&] { x.step(s); });
        CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    }
    auto find = [&](const std::string& name) -> const variant& {
        for (const auto& x : v)
            if (x.name == name) return x;
        throw std::logic_error(name);
    };
    const variant& per_block_ref = find("hand-written per-block graphs, composed");
    const variant& whole_ref = find("hand-written whole-step graph, composed");
    std::string table = "\n### Composed: gather hook on lane 1, clamp hook on lane 4, own activations offloaded on lanes 2-3 (" +
                        std::to_string(sh.blocks) + " blocks, " + std::to_string(m.store().plan().copied_groups()) + " of " +
                        std::to_string(m.store().plan().groups.size()) + " activation groups copied)\n\n";
    table += "Every variant's weights after 4 steps, against the model's one-stream loop:\n\n" + parity + "\n";
    table += "| variant | device ms/step (median) | host µs/step (median) | runtime API calls/step | cudaStreamWaitEvent/step | device vs its reference | host vs its reference | API calls vs its reference |\n";
    table += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
    auto waits = [](const bench::api_calls& a) {
        const auto it = a.runtime.find("cudaStreamWaitEvent");
        return it == a.runtime.end() ? 0L : it->second;
    };
    for (const auto& x : v) {
        csv.row("composed overhead", "tutorial 11 blocks", x.name, "device_ms", median(x.device_ms));
        csv.row("composed overhead", "tutorial 11 blocks", x.name, "host_us", median(x.host_us));
        csv.row("composed overhead", "tutorial 11 blocks", x.name, "runtime_api_calls", double(bench::api_counter::total(x.api.runtime)));
        csv.row("composed overhead", "tutorial 11 blocks", x.name, "stream_waits", double(waits(x.api)));
        const bool whole = x.name.find("full_iteration") != std::string::npos || x.name.find("whole-step") != std::string::npos;
        const variant& ref = whole ? whole_ref : per_block_ref;
        char row[512];
        std::snprintf(row, sizeof row, "| %s | %.4f | %.1f | %ld | %ld | %.3f (%s) | %.3f | %ld vs %ld |\n", x.name.c_str(), median(x.device_ms),
                      median(x.host_us), bench::api_counter::total(x.api.runtime), waits(x.api), median(x.device_ms) / median(ref.device_ms),
                      whole ? "hand whole" : "hand per-block", median(x.host_us) / median(ref.host_us), bench::api_counter::total(x.api.runtime),
                      bench::api_counter::total(ref.api.runtime));
        table += row;
    }
    table += "\nAPI calls per step, by function:\n\n";
    for (const auto& x : v) {
        table += "- " + x.name + ":" + x.api.by_function() + "\n";
    }
    return table;
}

} // namespace

int main(int argc, char** argv) {
    options o;
    bench::arguments("composed_overhead")
        .integer("--rounds", o.rounds, 1)
        .integer("--steps-per-round", o.steps_per_round, 1)
        .text("--markdown", o.markdown)
        .text("--csv", o.csv)
        .parse_or_exit(argc, argv);
    if (cuda::usable_device_count() == 0) {
        std::puts("no usable CUDA device: skipped");
        return cuda::skip_exit_code;
    }
    try {
        cudaDeviceProp prop{};
        CAPSCOPE_CHECK(cudaGetDeviceProperties(&prop, 0));
        cuda::stream s;
        bench::figures_csv csv(o.csv);
        std::string report = "Device: " + std::string(prop.name) + "; " + std::to_string(o.rounds) + " rounds x " +
                             std::to_string(o.steps_per_round) + " steps per variant, round-robin.\n";
        report += run(o, csv, s);
        std::fputs(report.c_str(), stdout);
        if (!o.markdown.empty()) std::ofstream(o.markdown) << report;
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "composed_overhead: %s\n", e.what());
        return 1;
    }
}
