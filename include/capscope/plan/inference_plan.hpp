#pragma once
//! @file
//! The plan of an inference forward (pure host), one per bucket. An `inference_program` holds
//! the forward stage list of every bucket (the same stages, launched at that bucket's size); the
//! plan splits each into segments with the same code the training plan uses:
//!
//! - inference scope `layer` (`inference::per_layer`): per-layer graphs of the captured regions
//!   (the config's modules; none = whole layers), the rest eager islands;
//! - inference scope `block` (`inference::per_block`): the whole forward, embedding to logits,
//!   as one graph;
//! - `none`: every stage eagerly.
//!
//! Every bucket has the same segments, so graph g of one bucket and graph g of another differ
//! only in launch sizes: the runner can turn one into the other with `cudaGraphExecUpdate`.

#include <capscope/plan/buckets.hpp>
#include <capscope/plan/print.hpp>
#include <capscope/plan/training_plan.hpp>
#include <capscope/vocabulary/inference_scope.hpp>

#include <string>
#include <vector>

namespace capscope {

//! What a server hands an inference runner: bucket b's forward, at `sizes[b]` rows, for every
//! bucket of the runner's list. Stages need no backward.
struct inference_program {
    std::vector<std::vector<stage>> buckets;
    //! The size (rows, or padded length) each list of `buckets` was built for: checked against
    //! the runner's bucket list, so a program built for other buckets is refused (P3).
    std::vector<int> bucket_sizes;
    //! Optional: the forward at any size up to the model's capacity, run eagerly, for requests
    //! past the largest bucket under `oversize_requests<oversize::run_eagerly>`.
    sized_stream_fn eager_forward;
};

struct inference_plan {
    inference_scope scope = inference_scope::eager;
    capture_scope capture;     //!< what the segments were split by
    bucket_list sizes;
    std::vector<stage_call> calls; //!< per bucket, in order: `microbatch` is the bucket index
    //! Segments of every bucket, bucket after bucket; each bucket has `segments_per_bucket`.
    std::vector<plan_segment> segments;
    int segments_per_bucket = 0;
    int graphs_per_bucket = 0; //!< graph numbers 0..graphs_per_bucket-1, the same in every bucket

    const plan_segment* bucket_begin(int b) const { return segments.data() + std::size_t(b) * std::size_t(segments_per_bucket); }
    const plan_segment* bucket_end(int b) const { return bucket_begin(b) + segments_per_bucket; }
    int eager_islands_per_run() const { return segments_per_bucket - graphs_per_bucket; }
};

//! The capture scope an inference scope splits a forward by.
constexpr capture_scope inference_capture_scope(inference_scope scope, const region_set& modules) {
    switch (scope) {
    case inference_scope::eager: return {graph_impl::eager, {}};
    case inference_scope::per_layer: return {graph_impl::lazy_per_layer, modules};
    case inference_scope::per_block: return {graph_impl::whole_iteration, {}};
    }
    return {};
}

namespace detail {
inline void check_inference_program(inference_scope scope, const capture_scope& capture, const bucket_list& sizes,
                                    const inference_program& p) {
    if (!sizes.well_formed())
        throw plan_error("P4", "", "the bucket list " + bucket_text(sizes) + " is not positive and strictly increasing",
                         "list the sizes ascending without repeats, e.g. buckets<1, 2, 4, 8>");
    if (p.buckets.size() != std::size_t(sizes.size()))
        throw plan_error("P3", "", "the inference program has " + std::to_string(p.buckets.size()) + " stage lists for " +
                                       std::to_string(sizes.size()) + " buckets " + bucket_text(sizes),
                         "give inference_program::buckets one forward per bucket, in the order of the bucket list");
    if (p.bucket_sizes.size() != p.buckets.size())
        throw plan_error("P3", "", "the inference program records " + std::to_string(p.bucket_sizes.size()) + " bucket sizes for " +
                                       std::to_string(p.buckets.size()) + " stage lists",
                         "set inference_program::bucket_sizes to the size each stage list was built for");
    for (std::size_t b = 0; b < p.buckets.size(); ++b)
        if (p.bucket_sizes[b] != sizes[int(b)])
            throw plan_error("P3", "", "stage list " + std::to_string(b) + " of the inference program was built for bucket " +
                                           std::to_string(p.bucket_sizes[b]) + ", but the runner's bucket " + std::to_string(b) + " is " +
                                           std::to_string(sizes[int(b)]) + " (runner " + bucket_text(sizes) + ")",
                             "build the program from the runner's bucket list (its config's buckets<...> or length_buckets<...>)");
    const auto& first = p.buckets.front();
    if (first.empty()) throw plan_error("P3", "", "bucket " + std::to_string(sizes[0]) + " has no stages", "give every bucket its forward");
    for (std::size_t b = 0; b < p.buckets.size(); ++b) {
        const auto& list = p.buckets[b];
        if (list.size() != first.size())
            throw plan_error("P3", "", "bucket " + std::to_string(sizes[int(b)]) + " has " + std::to_string(list.size()) +
                                           " stages, bucket " + std::to_string(sizes[0]) + " has " + std::to_string(first.size()),
                             "every bucket runs the same stages (only their sizes may differ)");
        for (std::size_t i = 0; i < list.size(); ++i) {
            if (!(list[i].facts() == first[i].facts()))
                throw plan_error("P3", list[i].name,
                                 "stage " + std::to_string(i) + " of bucket " + std::to_string(sizes[int(b)]) + " ('" + list[i].name +
                                     "') differs from the first bucket's ('" + first[i].name + "') in kind, layer, regions or capture facts",
                                 "every bucket runs the same stages (only their sizes may differ)");
            if (!list[i].forward) throw plan_error("P3", list[i].name, "stage '" + list[i].name + "' has no forward function", "bind stage::forward");
            if (list[i].lane != 0)
                throw plan_error("P3", list[i].name, "stage '" + list[i].name + "' of an inference program uses a side lane",
                                 "inference runners run a forward on one stream; fork and join inside the stage (stage::forks_to) instead");
            if (list[i].updated_in_graph)
                throw plan_error("P21", list[i].name,
                                 "stage '" + list[i].name + "' of an inference program is updated in the graph, which only the training "
                                 "runners do (an inference runner would replay the values of its capture)",
                                 "keep the stage's values in device memory, or leave it out of the captured regions (passes_host_values)");
        }
    }
    const auto facts = facts_of(first);
    check_selection(capture, facts);
    const misplacement m = find_misplacement(capture, facts);
    if (!m.found()) return;
    if (scope != inference_scope::per_block) throw_misplacement(capture, facts[std::size_t(m.stage)], m.problem, first[std::size_t(m.stage)].name);
    const std::string& name = first[std::size_t(m.stage)].name;
    throw plan_error(misplacement_rule(m.problem), name,
                     "stage '" + name + "' " + misplacement_words(m.problem) + ", yet inference scope block captures the whole forward",
                     "use inference scope layer (inference::per_layer) with modules that leave its regions out, or make the stage capturable");
}
} // namespace detail

//! Plans every bucket's forward; throws `plan_error` (P1-P4, P8, and P14-P16 for guarded stages) when the program cannot run so.
inline inference_plan make_inference_plan(inference_scope scope, const region_set& modules, const bucket_list& sizes,
                                          const inference_program& program) {
    inference_plan plan;
    plan.scope = scope;
    plan.capture = inference_capture_scope(scope, modules);
    plan.sizes = sizes;
    detail::check_inference_program(scope, plan.capture, sizes, program);

    const auto facts = detail::facts_of(program.buckets.front());
    std::vector<stage_range> ranges;
    split_segments(plan.capture, facts, [&](stage_range r) {
        // An eager run of stages under one guard stays one segment across layers (a decode loop
        // over every layer, run eagerly): the host decides it once (IF) or once per pass (WHILE),
        // as a node would. Captured runs split between graphs are refused (P16).
        if (!ranges.empty() && !r.graphed && !ranges.back().graphed) {
            const stage_facts& a = facts[std::size_t(ranges.back().first + ranges.back().count - 1)];
            const stage_facts& b = facts[std::size_t(r.first)];
            if (a.guarded != guard_kind::none && a.guarded == b.guarded && a.guard_flag == b.guard_flag && a.lane == b.lane) {
                ranges.back().count += r.count;
                return;
            }
        }
        ranges.push_back(r);
    });
    plan.segments_per_bucket = int(ranges.size());
    for (int b = 0; b < sizes.size(); ++b) {
        int graph = 0;
        for (const stage_range& r : ranges) {
            plan_segment seg;
            seg.microbatch = b; // the bucket
            seg.layer = plan.capture.impl == graph_impl::whole_iteration ? -1 : facts[std::size_t(r.first)].layer;
            seg.first_call = int(plan.calls.size());
            for (int k = 0; k < r.count; ++k) plan.calls.push_back({step_part::microbatch, b, r.first + k, phase::forward, {}, -1});
            seg.call_count = r.count;
            seg.graphed = r.graphed;
            seg.graph = r.graphed ? graph++ : -1;
            plan.segments.push_back(seg);
        }
        plan.graphs_per_bucket = graph;
    }
    // Guarded stages (P14-P16): a bucket's forward is one pass, so its flags are written in it.
    const training_program no_layers; // an inference stage touches what it declares
    auto stage_at = [&](const stage_call& c) -> const stage& { return program.buckets[std::size_t(c.microbatch)][std::size_t(c.stage)]; };
    detail::check_guard_runs(
        plan.calls, plan.segments, stage_at,
        [&](std::size_t i) { return access_of(stage_at(plan.calls[i]), phase::forward, step_part::microbatch, no_layers); },
        [](const stage_call& a, const stage_call& b) { return a.microbatch == b.microbatch; });
    return plan;
}

inline const stage& stage_of(const inference_program& p, const stage_call& c) {
    return p.buckets[std::size_t(c.microbatch)][std::size_t(c.stage)];
}

//! The plan as text: the scope, then bucket 0's segments (every bucket has the same ones).
inline std::string to_text(const inference_plan& plan, const inference_program& program) {
    static constexpr const char* scope_words[] = {"none (every stage eagerly)", "layer (per-layer graphs)",
                                                  "block (the whole forward as one graph)"};
    std::string out = "capscope inference plan: scope " + std::string(scope_words[std::size_t(plan.scope)]) + ", buckets " +
                      detail::bucket_text(plan.sizes) + "\n  per bucket: " + std::to_string(plan.graphs_per_bucket) + " graph" +
                      (plan.graphs_per_bucket == 1 ? "" : "s") + ", " + std::to_string(plan.eager_islands_per_run()) + " eager island" +
                      (plan.eager_islands_per_run() == 1 ? "" : "s") + "\n";
    for (const plan_segment* s = plan.bucket_begin(0); s != plan.bucket_end(0); ++s) {
        out += s->graphed ? "  g" + std::to_string(s->graph) + "  graph  " : std::string("      eager  ");
        out += detail::segment_stages(plan, program, *s, ", ") + "\n"; // guarded runs in braces: "WHILE 'again' { decode }"
    }
    return out;
}

//! The first bucket's segments as Graphviz DOT, in order: graphs filled, eager islands dashed, a
//! stage a line (a guarded run in braces), and the conditional nodes each graph holds.
inline std::string to_dot(const inference_plan& plan, const inference_program& program) {
    static constexpr const char* scope_words[] = {"none", "layer", "block"};
    std::string out = "digraph capscope_inference_plan {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10, shape=box];\n";
    out += "  label=\"inference scope " + std::string(scope_words[std::size_t(plan.scope)]) + ", buckets " + detail::bucket_text(plan.sizes) +
           ": " + std::to_string(plan.graphs_per_bucket) + " graph" + (plan.graphs_per_bucket == 1 ? "" : "s") + " per bucket (bucket " +
           std::to_string(plan.sizes[0]) + " shown)\";\n  labelloc=t;\n";
    int i = 0;
    for (const plan_segment* s = plan.bucket_begin(0); s != plan.bucket_end(0); ++s, ++i) {
        std::string label = (s->graphed ? "g" + std::to_string(s->graph) + "\\n" : std::string()) + detail::segment_stages(plan, program, *s, "\\n");
        if (const std::string g = detail::guard_list(plan, program, *s); !g.empty())
            label += s->graphed ? "\\n[conditional nodes: " + g + "]" : "\\n[guards read on the host: " + g + "]";
        out += "  s" + std::to_string(i) + " [label=\"" + label + "\"" +
               (s->graphed ? ", style=\"filled,bold\", fillcolor=\"#9fd3a8\"" : ", style=dashed") + "];\n";
        if (i > 0) out += "  s" + std::to_string(i - 1) + " -> s" + std::to_string(i) + ";\n";
    }
    out += "}\n";
    return out;
}

} // namespace capscope
