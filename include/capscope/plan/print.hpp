#pragma once
//! @file
//! The plan as text (for people and logs) and as Graphviz DOT (graphs as filled boxes, eager
//! islands as dashed ones, edges in execution order, graphs labelled in capture order).

#include <capscope/plan/training_plan.hpp>

#include <string>

namespace capscope {

namespace detail {

inline std::string count(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

inline std::string impl_description(graph_impl i) {
    return std::string(megatron_name(i)) + " (" + std::string(enum_names<graph_impl>::cpp[std::size_t(i)]) + ")";
}

inline std::string section_title(const plan_segment& s) {
    switch (s.part) {
    case step_part::step_begin: return "step begin";
    case step_part::step_end: return "step end";
    case step_part::microbatch: break;
    }
    return "microbatch " + std::to_string(s.microbatch) + " " + std::string(phase_name(s.direction));
}

//! A segment's stages, by name (training and inference plans alike).
template <class Plan, class Program>
std::string segment_stages(const Plan& plan, const Program& program, const plan_segment& s, const char* separator, bool lanes = false) {
    std::string out;
    // A guarded run in braces: "IF 'all_finite' { a b }", "IF 'all_finite' { a, b }", or a line each.
    const std::string sep = separator, inner = sep == ", " ? " " : sep;
    const stage_guard* open = nullptr;
    for (int k = 0; k < s.call_count; ++k) {
        const stage_call& c = plan.calls[std::size_t(s.first_call + k)];
        const stage& st = stage_of(program, c);
        const bool next_list = k > 0 && !same_list(plan.calls[std::size_t(s.first_call + k - 1)], c); // runs end with their list
        if (open && (!(st.guard == *open) || next_list)) {
            out += inner + "}";
            open = nullptr;
        }
        if (k) out += sep;
        if (st.guard && !open) {
            open = &st.guard;
            out += std::string(guard_word(st.guard.kind)) + " '" + name_of(st.guard.predicate) + "' {" + inner;
        }
        out += st.name;
        if (lanes && st.lane != s.lane) out += " [lane " + std::to_string(st.lane) + "]"; // a branch
        if (s.graphed && st.updated_in_graph) out += " [updated before each replay]";
    }
    if (open) out += inner + "}";
    return out;
}

//! The guards of a segment's calls, one per guarded run: "IF 'all_finite', WHILE 'again'"
//! (training and inference plans alike).
template <class Plan, class Program> std::string guard_list(const Plan& plan, const Program& program, const plan_segment& s) {
    std::string out;
    const stage_guard* last = nullptr;
    for (int k = 0; k < s.call_count; ++k) {
        const stage_call& c = plan.calls[std::size_t(s.first_call + k)];
        const stage& st = stage_of(program, c);
        if (k > 0 && !same_list(plan.calls[std::size_t(s.first_call + k - 1)], c)) last = nullptr; // a new run
        if (st.guard && !(last && st.guard == *last))
            out += (out.empty() ? "" : ", ") + std::string(guard_word(st.guard.kind)) + " '" + name_of(st.guard.predicate) + "'";
        last = st.guard ? &st.guard : nullptr;
    }
    return out;
}

inline std::string capture_policy(const training_plan& plan) {
    const std::string warmup = std::to_string(plan.warmup_steps) + " eager warmup step" + (plan.warmup_steps == 1 ? "" : "s");
    switch (plan.scope.impl) {
    case graph_impl::eager: return "no graphs: every stage runs eagerly";
    case graph_impl::lazy_per_layer: return "each captured the first time it runs, after " + warmup;
    case graph_impl::ahead_of_time_per_layer: return "all captured ahead of time in the order g0, g1, ..., after " + warmup;
    case graph_impl::whole_iteration: return "the whole step, captured after " + warmup;
    }
    return "";
}

//! The calls a range of the plan's waits waits for: "layer1.hook.gather on lane 1, ...".
inline std::string wait_list(const training_plan& plan, const training_program& program, wait_range r) {
    std::string out;
    for (const derived_wait& w : plan.waits_of(r)) {
        const stage& p = stage_of(program, plan.calls[std::size_t(w.producer)]);
        out += (out.empty() ? "" : ", ") + p.name + (p.lane ? " on lane " + std::to_string(p.lane) : std::string());
    }
    return out;
}

//! What a segment's line says beside its stages: its lane, what it waits for, why it has a graph
//! of its own.
//! The calls of a segment that run on another lane than the segment's (branches, or in the whole
//! iteration every lane call): "a on lane 2, b on lane 3".
inline std::string branch_list(const training_plan& plan, const training_program& program, const plan_segment& s) {
    std::string out;
    for (int k = 0; k < s.call_count; ++k) {
        const stage& st = stage_of(program, plan.calls[std::size_t(s.first_call + k)]);
        if (st.lane != s.lane) out += (out.empty() ? "" : ", ") + st.name + " on lane " + std::to_string(st.lane);
    }
    return out;
}

inline std::string segment_notes(const training_plan& plan, const training_program& program, const plan_segment& s) {
    std::string out;
    if (s.lane != 0) out += "  [side lane " + std::to_string(s.lane) + "]";
    if (const std::string b = branch_list(plan, program, s); !b.empty()) out += "  [branches joined at the segment's end: " + b + "]";
    if (s.waits.count) out += "  [waits for " + wait_list(plan, program, s.waits) + "]";
    for (int k = 0; k < s.call_count; ++k) // inside the segment: a call waiting for a branch of it
        if (const stage_call& c = plan.calls[std::size_t(s.first_call + k)]; c.waits.count)
            out += "  [" + stage_of(program, c).name + " waits for " + wait_list(plan, program, c.waits) + "]";
    if (const std::string g = guard_list(plan, program, s); !g.empty())
        out += s.graphed ? "  [conditional nodes: " + g + "]" : "  [guards read on the host: " + g + "]";
    if (s.undeclared_call >= 0)
        out += "  [own graph: '" + stage_of(program, plan.calls[std::size_t(s.undeclared_call)]).name +
               "' does not declare its buffers (stage::buffers_declared)]";
    return out;
}

//! ", modules {attn, mlp}" (Megatron's modules), ", regions {attn, down}" (a trainer's own among them), or
//! ", modules <whole layer>".
inline std::string scope_regions(const region_set& regions) {
    if (regions.empty()) return ", modules <whole layer>";
    bool own = false;
    regions.for_each([&](std::string_view r) { own = own || !parse_megatron_name<capture_module>(r); });
    return std::string(own ? ", regions {" : ", modules {") + module_list(regions) + "}";
}

} // namespace detail

inline std::string to_text(const training_plan& plan, const training_program& program) {
    std::string out = "capscope plan: impl " + detail::impl_description(plan.scope.impl);
    if (is_per_layer(plan.scope.impl))
        out += detail::scope_regions(plan.scope.regions);
    out += ", " + std::to_string(plan.microbatches) + " microbatch" + (plan.microbatches == 1 ? "" : "es") + "\n";
    out += "  " + std::to_string(plan.graph_count) + " graph" + (plan.graph_count == 1 ? "" : "s") + ": " + detail::capture_policy(plan) + "\n";
    out += "  per step: " + detail::count(plan.graph_launches_per_step(), "graph launch", "graph launches") + ", " +
           detail::count(plan.eager_islands_per_step(), "eager island", "eager islands") + " (" +
           detail::count(plan.eager_calls_per_step(), "stage call", "stage calls") + ")\n";
    std::string section;
    for (const plan_segment& s : plan.segments) {
        if (plan.scope.impl == graph_impl::whole_iteration) {
            out += "whole step\n  graph g0     " + std::to_string(s.call_count) + " stage calls: step begin, " +
                   std::to_string(plan.microbatches) + " x (forward, backward), step end\n";
            // Lane work inside the one graph: what forks onto a side lane, and who waits for it.
            for (int k = 0; k < s.call_count; ++k) {
                const stage_call& c = plan.calls[std::size_t(s.first_call + k)];
                const stage& st = stage_of(program, c);
                const std::string where = c.microbatch >= 0 ? " (microbatch " + std::to_string(c.microbatch) + " " + std::string(phase_name(c.direction)) + ")" : "";
                if (st.lane) out += "    " + st.name + where + ": forked onto lane " + std::to_string(st.lane) + "\n";
                if (st.guard) out += "    " + st.name + where + ": in conditional node " + guard_word(st.guard.kind) + " '" + name_of(st.guard.predicate) + "'\n";
                if (st.updated_in_graph) out += "    " + st.name + where + ": a child graph, recorded again and updated before each replay\n";
                if (c.waits.count) out += "    " + st.name + where + ": waits for " + detail::wait_list(plan, program, c.waits) + "\n";
            }
            continue;
        }
        const std::string title = detail::section_title(s);
        if (title != section) out += (section = title) + "\n";
        std::string tag = s.graphed ? "graph g" + std::to_string(s.graph) : std::string("eager");
        if (s.shared) tag += " (shared with microbatch 0)";
        tag.resize(std::max<std::size_t>(tag.size() + 1, 13), ' ');
        out += "  " + tag + detail::segment_stages(plan, program, s, " ") + detail::segment_notes(plan, program, s) + "\n";
    }
    if (plan.end_waits.count) out += "step end: the step's stream waits for " + detail::wait_list(plan, program, plan.end_waits) + "\n";
    if (program.rerun)
        out += "after the step: '" + name_of(program.rerun.flag) + "' read on the host; when set" +
               (program.rerun.reason.empty() ? std::string() : " (" + program.rerun.reason + ")") +
               ", the step is refused (its optimizer guarded) and run again, every call eagerly\n";
    return out;
}

inline std::string to_dot(const training_plan& plan, const training_program& program) {
    std::string out = "digraph capscope_plan {\n  rankdir=TB; newrank=true;\n  node [fontname=\"Helvetica\", fontsize=10, shape=box];\n";
    out += "  label=\"" + detail::impl_description(plan.scope.impl);
    if (is_per_layer(plan.scope.impl))
        out += detail::scope_regions(plan.scope.regions);
    out += ": " + std::to_string(plan.graph_count) + " graphs, " + detail::capture_policy(plan) + "\";\n  labelloc=t;\n";
    std::string section, column; // a section's segments stand in one column: rank=same
    int cluster = 0;
    auto close_section = [&] {
        if (section.empty()) return;
        out += "    {rank=same;" + column + "}\n  }\n";
        column.clear();
    };
    for (std::size_t i = 0; i < plan.segments.size(); ++i) {
        const plan_segment& s = plan.segments[i];
        const std::string title = plan.scope.impl == graph_impl::whole_iteration ? std::string("whole step") : detail::section_title(s);
        if (title != section) {
            close_section();
            out += "  subgraph cluster_" + std::to_string(cluster++) + " {\n    label=\"" + title + "\";\n    style=rounded; color=gray60;\n";
            section = title;
        }
        column += " s" + std::to_string(i) + ";";
        std::string label;
        if (plan.scope.impl == graph_impl::whole_iteration) {
            label = "g0: " + std::to_string(s.call_count) + " stage calls\\n(" + std::to_string(plan.microbatches) +
                    " microbatches + optimizer)";
            if (const std::string g = detail::guard_list(plan, program, s); !g.empty()) label += "\\n[conditional nodes: " + g + "]";
            std::string updated; // (per-layer labels list their stages, each marked)
            for (int k = 0; k < s.call_count; ++k) {
                const stage& st = stage_of(program, plan.calls[std::size_t(s.first_call + k)]);
                if (st.updated_in_graph && updated.find("'" + st.name + "'") == std::string::npos) updated += (updated.empty() ? "'" : ", '") + st.name + "'";
            }
            if (!updated.empty()) label += "\\n[updated before each replay: " + updated + "]";
        } else {
            label = (s.graphed ? "g" + std::to_string(s.graph) + (s.shared ? " (shared)" : "") + "\\n" : std::string()) +
                    detail::segment_stages(plan, program, s, "\\n", true) + (s.lane ? "\\n[side lane " + std::to_string(s.lane) + "]" : std::string()) +
                    (s.waits.count ? "\\n[waits for " + detail::wait_list(plan, program, s.waits) + "]" : std::string());
        }
        out += "    s" + std::to_string(i) + " [label=\"" + label + "\"" +
               (s.graphed ? ", style=\"filled,bold\", fillcolor=\"#9fd3a8\"" : ", style=dashed") + "];\n";
    }
    close_section();
    // Execution order; a section's first segment sits under the previous section's first, so
    // the sections read as left-aligned rows.
    std::string previous_title, previous_first;
    for (std::size_t i = 0; i < plan.segments.size(); ++i) {
        const std::string title = plan.scope.impl == graph_impl::whole_iteration ? std::string("whole step") : detail::section_title(plan.segments[i]);
        const bool new_row = title != previous_title;
        if (i > 0) out += "  s" + std::to_string(i - 1) + " -> s" + std::to_string(i) + (new_row ? " [constraint=false];\n" : ";\n");
        if (new_row) {
            if (!previous_first.empty()) out += "  " + previous_first + " -> s" + std::to_string(i) + " [style=invis, weight=10];\n";
            previous_first = "s" + std::to_string(i);
            previous_title = title;
        }
    }
    out += "}\n";
    return out;
}

} // namespace capscope
