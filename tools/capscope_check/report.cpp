#include "report.hpp"

#include <capscope/rules/not_applicable.hpp>

#include <fmt/format.h>

namespace capscope::check {

namespace {
nlohmann::json field_json(const described_field& f) {
    if (f.is_list) return f.items;
    if (f.items.empty()) return nullptr;
    if (f.is_bool) return f.items.front() == "true";
    if (f.is_number) {
        // JSON has no inf or NaN (which Megatron's parser takes for a float flag): those go as text.
        nlohmann::json n = nlohmann::json::parse(f.items.front(), nullptr, false);
        return n.is_discarded() ? nlohmann::json(f.items.front()) : n;
    }
    return f.items.front();
}
nlohmann::json findings_json(const std::vector<finding>& fs) {
    auto out = nlohmann::json::array();
    for (const finding& f : fs)
        out.push_back({{"rule", f.rule->id}, {"kind", kind_name(f.rule->kind)}, {"message", f.text()}, {"fix", f.rule->fix}});
    return out;
}
} // namespace

nlohmann::json to_json(const flags::megatron_command_line& line, const validation_report& report) {
    nlohmann::json normalized = nlohmann::json::object();
    for (const described_field& f : describe(report.normalized)) normalized[f.key] = field_json(f);
    auto refused = nlohmann::json::array();
    for (const auto& r : line.refused_inputs) refused.push_back({{"where", r.where}, {"message", r.message}, {"fix", r.fix}});
    return {
        {"valid", report.valid() && line.refused_inputs.empty()},
        {"refused_inputs", refused},
        {"normalized", report.later_stages_skipped ? nlohmann::json(nullptr) : normalized},
        {"violations", findings_json(report.violations)},
        {"notes", findings_json(report.notes)},
        {"later_stages_skipped", report.later_stages_skipped},
        {"derived",
         {{"params_dtype", line.derived.params_dtype},
          {"pipeline_model_parallel_size", line.derived.pipeline_model_parallel_size},
          {"virtual_pipeline_model_parallel_size", line.derived.virtual_pipeline_model_parallel_size
                                                       ? nlohmann::json(*line.derived.virtual_pipeline_model_parallel_size)
                                                       : nlohmann::json(nullptr)},
          {"mtp_num_layers", line.derived.mtp_num_layers}}},
        {"read", line.read},
        {"ignored", line.ignored},
        {"unknown", line.unknown},
    };
}

std::string to_text(const flags::megatron_command_line& line, const validation_report& report, bool verbose) {
    // The verdict and what to fix first; the normalized configuration (45 lines) only when asked.
    std::string out;
    if (!line.refused_inputs.empty()) {
        out += fmt::format("capscope-check: the configuration is INVALID: Megatron refuses {} input{} before the CUDA-graph rules\n",
                           line.refused_inputs.size(), line.refused_inputs.size() == 1 ? "" : "s");
        for (const auto& r : line.refused_inputs) out += fmt::format("  [{}] {}\n      fix: {}\n", r.where, r.message, r.fix);
        out += "\n";
    }
    if (report.valid() && line.refused_inputs.empty()) out += "capscope-check: the configuration is VALID\n";
    else if (!line.refused_inputs.empty())
        out += fmt::format("the CUDA-graph rules: {} violation{}\n", report.violations.size(), report.violations.size() == 1 ? "" : "s");
    else out += fmt::format("capscope-check: the configuration is INVALID ({} violation{})\n", report.violations.size(),
                            report.violations.size() == 1 ? "" : "s");
    if (!report.violations.empty()) {
        out += "\nviolations:\n";
        for (const finding& v : report.violations)
            out += fmt::format("  [{}] {}\n      fix: {}\n", v.rule->id, v.text(), v.rule->fix);
    }
    if (!report.notes.empty()) {
        out += "\nnotes (migrations and adjustments Megatron applies):\n";
        for (const finding& n : report.notes) out += fmt::format("  [{}] {}\n      to be explicit: {}\n", n.rule->id, n.text(), n.rule->fix);
    }
    if (!line.ignored.empty()) {
        out += "\nignored (Megatron flags no capture rule reads):";
        for (const auto& f : line.ignored) out += " " + f;
        out += "\n";
    }
    if (!line.unknown.empty()) {
        out += "\nunknown (not Megatron-LM flags; ignored as asked):";
        for (const auto& f : line.unknown) out += " " + f;
        out += "\n";
    }
    if (report.later_stages_skipped) {
        out += "\nnormalized configuration: not available (normalization failed; later rules were not evaluated)\n";
    } else if (verbose) {
        out += "\nnormalized configuration:\n";
        for (const described_field& f : describe(report.normalized)) out += fmt::format("  {:<46} {}\n", f.key, f.text());
    } else {
        out += "\n(--verbose prints the normalized configuration)\n";
    }
    return out;
}

std::string rules_text() {
    std::string out;
    for (const rule_info& r : rule_table)
        out += fmt::format("{:<5} {:<10} {:<14} {}\n", r.id, kind_name(r.kind), stage_name(r.stage), r.statement);
    return out;
}

std::string rules_markdown() {
    auto cell = [](std::string_view s) {
        std::string t(s);
        for (std::size_t p = 0; (p = t.find('|', p)) != std::string::npos; p += 2) t.replace(p, 1, "\\|");
        return t;
    };
    std::string out =
        "# capscope rules\n\n"
        "<!-- Generated by `capscope-check --list-rules --markdown`; a test fails when this file is stale. -->\n\n"
        R"md(## Index

Every rule family in one table. The Megatron rule table has its own section below, one row per rule.
Paths are under `include/capscope/`.

When a rule is checked:

- **compile time**: a `static_assert` fails where the type is named; its text starts with the rule id.
- **run time**: `validate(runtime_config)` and `capscope-check` report it, with the same id, message and fix.
- **plan time**: a `plan_error` is thrown when a plan is made (`make_training_plan`, `make_inference_plan`: when a
  runner is built, or a bucket runner rebound).
- **construction**: an exception is thrown while an object is set up (a runner built, an activation store
  allocated), before any capture.
- **request time**: a `bucket_overflow` is thrown when a request is placed in a bucket.

| rule | family | checked when | what it refuses | where |
|---|---|---|---|---|
| K1–K3 | config spelling | compile time (`config<...>`; `is_valid_config` and `rejecting_rule` say so without a diagnostic) | a kind of option named twice, in `config<...>`, `model<...>`, `offload<...>` or `vision<...>` (K1); a real value that is no number, `fraction{n, 0}` (K2); an argument that is no option (K3); checked before every other rule | `config/spelling.hpp` |
| N1–N12 (N3b, N4b, N5b, N8a–N8g) | Megatron: normalization | compile time; run time | legacy and deprecated flags used together, unknown impls, modules and inference scopes; N3, N3b, N4b, N5b, N8c, N8f, N8g migrate and N10 derives a default | `rules/normalization.hpp` |
| S0–S7 | Megatron: capture scope | compile time; run time | module lists that cannot be captured together or in this model; S1 is an adjustment | `rules/capture_scope.hpp` |
| R0–R5 | Megatron: recompute | compile time; run time | unknown recompute modules, and recompute a graph cannot hold | `rules/recompute.hpp` |
| O1–O3, O5–O7, O10 | Megatron: offload | compile time; run time | offload lists and sizes Megatron refuses, and offloading off the transformer_engine layers (Megatron's module names only; a trainer's own names pass, except O6's sizes and fraction) | `rules/offload.hpp` |
| OC1–OC6 | Megatron: offload with graphs | compile time; run time | offloading the impl and the captured modules cannot hold (Megatron's module names only; a trainer's own names pass, except OC5's warmup step) | `rules/offload.hpp` |
| OB1, OB2 | Megatron: offload at graph boundaries | compile time (an error); run time (a note) | offloading a norm's input that crosses a graph boundary (adjustments) | `rules/offload.hpp` |
| A1–A3, A6 | Megatron: training | compile time; run time | training and inference settings that break graphs (NaN check, fp8 block graphs, graph count, pipelined inference) | `rules/training.hpp` |
| E1 | Megatron: training | compile time; run time | transformer_engine moe/mlp graphs with expert-parallel comm overlap | `rules/training.hpp` |
| F1, F2, F4, X10, X11 | Megatron: FSDP | compile time; run time | per-layer graphs without static FSDP buffers, and FSDP modes that refuse graphs; F4 migrates | `rules/training.hpp` |
| V1–V5 | Megatron: vision | compile time; run time | vision impls and modules capscope cannot capture, a negative sequence length; V4, V5 migrate | `rules/vision.hpp` |
| E2, E3, A4, A5, A7–A11, R6, O4, O8, O9, O11, X1–X9, X12 | Megatron: not applicable | never | nothing: see "Not applicable" below for why | `rules/not_applicable.hpp` |
| F1 | sharding | compile time (`sharding_fits`, `composition::sharded<Policy>()`) | per-layer graphs with `sharded<dynamic_gather_buffer>` (gather addresses change) | `parallel/sharding.hpp` |
| F2 | sharding | compile time (`sharding_fits`, `composition::sharded<Policy>()`) | per-layer graphs with `sharded<..., dynamic_buffer>` (a pool miss gets a fresh address) | `parallel/sharding.hpp` |
| P1 | plan | compile time (layer schemas); plan time | a captured stage that synchronizes with the host | `plan/misplaced_stage.hpp`, `plan/plan_error.hpp` |
| P2 | plan | compile time (layer schemas); plan time | a captured stage whose launch shapes depend on data | `plan/misplaced_stage.hpp`, `plan/plan_error.hpp` |
| P3 | plan | plan time | a malformed program: no stages, microbatches or buckets that differ, a stage without a function, a lane out of range, a branch on lane 0, a declared buffer with no address, no bytes or an end past the address space, a `reads_parameters_of` layer the program lacks | `plan/training_plan.hpp`, `plan/inference_plan.hpp`, `run/bucket_runner.hpp` |
| P4 | plan (inference) | compile time (`buckets<...>`, `length_buckets<...>`, `megatron_buckets<...>`); plan time | bucket lists that are not positive and strictly increasing | `config/inference_options.hpp`, `plan/inference_plan.hpp` |
| P5 | plan (inference) | compile time (where the runner type is named) | an inference runner without buckets; a vision runner without a length to pad to | `plan/inference_settings.hpp` |
| P6 | plan (inference) | request time | a request larger than the largest bucket, unless `oversize::run_eagerly` | `plan/buckets.hpp` |
| P7 | plan (vision) | request time | a sample longer than the largest length bucket | `plan/buckets.hpp` |
| P8 | plan | compile time (layer schemas); plan time | a captured stage that passes host values to its kernels at launch | `plan/misplaced_stage.hpp`, `plan/plan_error.hpp` |
| P9 | plan | compile time (`layer_plans`); plan time | named regions that match no stage, so nothing would be captured | `plan/layer_plan.hpp`, `plan/plan_error.hpp` |
| P10 | plan | construction (a `runner`; `plan_error`) | model facts (`layers<N>`, the MoE layout) that are not the program's | `plan/model_facts.hpp` |
| P11 | plan (offload) | compile time (layer schemas); plan time (when the copies are added, and on the final program) | an offloaded tensor whose producer and keeper a graph boundary separates | `plan/offload_placement.hpp`, `offload/with_offload.hpp` |
| P12 | plan (verifier) | plan time (every plan) | two calls that touch one buffer, one writing, left unordered | `plan/verify.hpp` |
| P13 | plan (hooks) | plan time | a capture-time stage (a `capture_time` hook) in an eager segment, which would never run | `plan/training_plan.hpp` |
| P14 | plan (guards) | compile time (layer schemas); plan time | a guarded stage that synchronizes with the host (guarded stages run inside a conditional node) | `plan/guards.hpp` |
| P15 | plan (guards) | compile time (layer schemas); plan time | a guard's flag that no earlier call writes, or a WHILE run that never writes it | `plan/guards.hpp` |
| P16 | plan (guards) | plan time | a guarded run split between segments or lanes | `plan/guards.hpp` |
| P17 | plan (NaN check) | construction (a `runner` with `nan_check_on_device`) | an optimizer not guarded by a finite check's flag | `plan/guards.hpp` |
| P18 | plan (rerun) | construction (a `runner`) | a step that may be refused without a sound rerun: no rerun where the config asks for one, no `before`, a flag never cleared, an unguarded optimizer, a collective in the step | `plan/guards.hpp` |
| P19 | plan (parameters) | plan time | a call that reads layer L's parameters after another layer's writer overwrote them (layers sharing a double buffer of gathered weights, without a re-gather), or reads another layer's (`reads_parameters_of`) before that layer's own writer ran | `plan/training_plan.hpp` |
| P20 | plan (capture doctor) | the last eager warmup step (a `runner` of a capturing impl with `warmup_steps` of 2 or more; `capture_doctor_off` turns it off) | a call, in a stage that will be captured, that a graph cannot hold: a launch on the legacy or per-thread default stream or on a stream the stage was not given, a synchronous copy, memset, synchronization or allocation, a query, a fork left unjoined; CUDA work a trainer does between two regions that one graph holds (`in_place_runner`) | `run/capture_doctor.hpp`, `run/runner.hpp`, `run/in_place_runner.hpp` |
| P21 | plan | plan time | a stage updated in the graph before each replay (`updated_in_graph`) that is guarded (a conditional node's body cannot hold a stage recorded again on its own), or in an inference program (its runners do not update) | `plan/training_plan.hpp`, `plan/inference_plan.hpp` |
| C1–C3 | composition | compile time (`composition<Config>`) | a part named twice: hooks (C1), an activation store (C2), a sharding policy (C3) | `compose/composition.hpp` |
| H0 | hooks | compile time | a pipeline entry that is not a hook; an unknown placement or option; two lanes; a lane on a boundary hook; both `first_microbatch_only` and `last_microbatch_only` | `hooks/hook.hpp`, `hooks/hook_pipeline.hpp` |
| H1 | hooks | compile time | a callable that does not take its declared phase's context (`warmup_context&` for a warmup hook) | `hooks/hook.hpp` |
| H2 | hooks | compile time (`hooks_fit`, `composition::hooks`) | a boundary hook under `impl::whole_iteration` | `hooks/hooks_fit.hpp` |
| H4 | hooks | compile time | a capturable hook that declares `synchronizes_with_host` | `hooks/hook.hpp` |
| H5 | hooks (pipelined passes) | compile time (`fits_pipelined_passes`, `with_pass_hooks`, `step_hook_stages`, `gpt::pipeline_model::set_hooks`) | on a pipelined model's passes: a boundary or capture-time hook (of a layer or of the step), `first_microbatch_only` or `last_microbatch_only`, a warmup hook | `hooks/with_pass_hooks.hpp` |
| (no id) | schema | compile time | a `regions<...>` entry that is neither a capture module nor a trainer's own `region<"name">` | `stage/schema.hpp` |
| (no id) | schema match | construction (a `runner`; `schema_mismatch`) | a layer of the program that matches none of the runner's layer schemas | `plan/match_schemas.hpp` |
| (no id) | offload plan | construction (`activation_store::allocate`; `std::invalid_argument`) | a ring outside the lanes, a tensor without a layer or a size, a policy under which nothing moves | `offload/offload_plan.hpp` |
| (no id) | Megatron inputs | run time (`capscope-check`) | flags outside the graph options that Megatron's `validate_args` refuses (hybrid layer pattern, pipeline split) | `flags/validate_args_inputs.hpp` |

Notes:

- F1 and F2 appear twice. They are one rule each: the sharding check builds the Megatron-FSDP flags from the
  policy and asks the table's F1 and F2.
- H3 is unused: no rule has that id. Ids are not reused or renumbered, so the hook rules are H0, H1, H2, H4, H5.
- Ids from `megatron-rules.md` that are not listed (F3, F5–F7) have no rule of their own: F3 is the
  "not full_iteration" condition inside F1 and F2, F5 is a flag only, F6 is X10/X11, F7 is A11.

)md"
        "## Megatron rule table\n\n"
        "Every rule of the table, in the order both enforcers evaluate them (Megatron's order: later rules see migrated values).\n"
        "Ids follow `../shared/reference/megatron-rules.md`; letters after a spec id (N3b, N8a …) split one spec row\n"
        "into its cases; OB1/OB2 are the graph-boundary offload adjustments of spec §4.4; V1–V5 the vision rules of §6.\n\n"
        "Kinds: **error** rejects at run time and compile time; **migration** rewrites a deprecated input (a note at\n"
        "run time); **default** derives an unset value silently; **adjustment** is something Megatron completes or\n"
        "downgrades silently: a note at run time, an error at compile time (a C++ configuration spells out what runs).\n\n"
        "| id | kind | stage | rule | message | fix |\n|---|---|---|---|---|---|\n";
    for (const rule_info& r : rule_table)
        out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.id, kind_name(r.kind), stage_name(r.stage),
                           cell(r.statement), cell(r.message), cell(r.fix));
    out += "\n## Not applicable\n\nSpec rules capscope does not enforce, and why.\n\n| spec id | rule | why not |\n|---|---|---|\n";
    for (const not_applicable_rule& n : not_applicable_rules)
        out += fmt::format("| {} | {} | {} |\n", n.id, cell(n.rule), cell(n.reason));
    return out;
}

} // namespace capscope::check
