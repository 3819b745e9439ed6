#!/usr/bin/env python3
"""Compares Megatron-LM's verdicts with capscope-check's, case by case, and writes the
conformance report (Markdown) that docs/conformance.md holds.

A case agrees when both accept with the same impl, modules and inference scope (and, in the
second set, the same rule inputs after validate_args's rewrites), or both reject: with the same
rule (Megatron's message is mapped to capscope's rule id below), by refusing the same input
before the rules (capscope quotes Megatron's message), or both with a usage error. Megatron stops at its first failing check; capscope reports every
rule a configuration breaks, so agreement asks that Megatron's rule is among capscope's, and
the report counts how often it is also capscope's first.

usage: compare.py (--cases cases.jsonl --megatron megatron.jsonl | --recorded FILE)
                  --capscope capscope.jsonl      exit 1 on a disagreement not explained below
"""
import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capscope_verdicts  # noqa: E402

import generate_cases  # noqa: E402



def shown_argv(argv):
    """The case without the leading base-model flags (both sets start with them)."""
    base = generate_cases.BASE
    n = 0
    while n < len(argv) and n < len(base) and argv[n] == base[n]:
        n += 1
    return argv[n:]

# Megatron's message (or, for bare asserts, where it was raised) -> capscope's rule id.
MEGATRON_RULES = [
    (r"Do not use --enable-cuda-graph or --external-cuda-graph with", "N1"),
    (r"--enable-cuda-graph and --external-cuda-graph cannot be enabled", "N2"),
    (r"--cuda-graph-scope and --cuda-graph-modules cannot be used together", "N4"),
    (r"full scope cannot be used with other scopes", "N5"),
    (r"must be strings or CudaGraphModule", "N6"),
    (r"cannot contain multiple deprecated values", "N7"),
    (r"'full_iteration' cannot be combined with cuda_graph_impl", "N8a"),
    (r"'full_iteration' cannot be combined with inference_cuda_graph_scope", "N8b"),
    (r"'full_iteration_inference' cannot be combined with cuda_graph_impl", "N8d"),
    (r"'full_iteration_inference' cannot be combined with inference_cuda_graph_scope", "N8e"),
    (r"Invalid cuda graph implementation", "N9"),
    (r"Invalid inference CUDA graph scope", "N11"),
    (r"cuda-graph-modules must be empty when|cuda_graph_modules must be empty when", "N12"),
    (r"CUDA graphs not supported with CPU offloading", "S0"),
    (r"must not contain both moe and moe_router", "S2"),
    (r"moe_preprocess cuda graph is only supported with moe_router", "S3"),
    (r"moe cuda graph is only supported for MoE", "S4"),
    (r"mlp cuda graph is only supported for dense layers", "S5"),
    (r"only supported with drop-padding MoE", "S6"),
    (r"DtoH copies and synchronizations in the preprocess", "S7"),
    (r"Invalid choices for recompute_modules", "R0"),
    (r"full recompute is only supported with full iteration", "R1"),
    (r"moe recompute is not supported with moe_router CUDA graph", "R2"),
    (r"attention dropout is not supported with graphed attention", "R3"),
    (r"hidden dropout is not supported with graphed MLP/MoE", "R4"),
    (r"moe_input_jitter_eps is not supported with graphed moe", "R5"),
    (r"fine_grained_activation_offloading cannot be enabled with cpu_offloading", "O1"),
    (r"Invalid choices for offload_modules|transformer_config.py:2131$", "O2"),
    (r"attn_proj cannot be set to offload_modules alone", "O3"),
    (r"while recomputing the entire MoE layer", "O5"),
    (r"min_offloaded_tensor_size must be non-negative|activation_offload_fraction must be in "
     r"range|delta_offload_bytes_across_pp_ranks must be non-negative", "O6"),
    (r"fused_group_mlp requires use_transformer_engine_op_fuser|fused_group_mlp offloads the "
     r"whole fused grouped MLP", "O7"),
    (r"Fine-grained activation offloading is only supported with transformer_engine impl", "O10"),
    (r"with cuda_graph_impl='local' only supports offload_modules", "OC1"),
    (r"not supported with whole-layer CUDA graph capture", "OC2"),
    (r"offloading is only supported with transformer_engine CUDA graph", "OC3"),
    (r"Token-drop MoE is temporarily not supported with activation offloading", "OC4"),
    (r"cuda_graph_warmup_steps must be greater than 0", "OC5"),
    (r"fine_grained_offloading_max_inflight_offloads must be a non-negative", "OC6"),
    (r"CUDA graph scope on moe and mlp is not supported with overlap_moe", "E1"),
    (r"--no-check-for-nan-in-loss-and-grad should be set", "A1"),
    (r"with --inference-cuda-graph-scope=block", "A2"),
    (r"inference_dynamic_batching_num_cuda_graphs should be a positive", "A3"),
    (r"Pipeline-parallel microbatched inference is incompatible", "A6"),
]


# Disagreements that are understood, with the reason. Each entry: (outcome, test, reason).
EXPLAINED = [
    ("capscope rejects, Megatron accepts",
     lambda m, c: c["rules"] and set(c["rules"]) <= {"F1", "F2", "X10", "X11"} and not c.get("refused"),
     "Megatron-FSDP rules that Megatron does not check in these three calls. F1 and F2 come from "
     "Megatron PR #4232 (open, not in main at this commit): per-layer graphs with Megatron-FSDP "
     "need the double buffer and the persistent-buffer fallback, or replays read parameter "
     "buffers that have moved. X10 and X11 are Megatron's own checks, in "
     "mcore_fsdp_adapter.py when the model is wrapped, after core_transformer_config_from_args. "
     "capscope reports all four before launch."),
    ("capscope rejects, Megatron accepts",
     lambda m, c: not c["rules"] and any("gpt_layer_specs.py" in r or "moe_layer_pattern" in r
                                         or "--moe-layer-freq" in r for r in c.get("refused", [])),
     "The MoE layer pattern. Megatron reads --moe-layer-freq in parse_args and checks it only when "
     "it builds the layers (get_gpt_decoder_block_spec in gpt_layer_specs.py, after these three "
     "calls): a list whose length is not the layer count, an empty list and entries other than 0 "
     "and 1 fail there, a frequency of 0 divides by zero, and -1 makes every layer MoE by "
     "accident of Python's modulo. capscope refuses all of them before launch."),
    (None,
     lambda m, c: "supports MoE FP8 training, but your version is 0.0.0" in m.get("message", ""),
     "Environment: the conformance machine has no Transformer Engine, and Megatron's MoE fp8 "
     "check reads TE's version (0.0.0 here). Not a CUDA-graph rule; with TE >= 1.7 the case "
     "goes on to the graph rules."),
    (None,
     lambda m, c: "requires FlashInfer >= 0.6.4" in m.get("message", ""),
     "Environment: the conformance machine has no FlashInfer, which Megatron requires for "
     "mxfp8 with inference_optimized layers (validate_args, before rule A2). These are rule A2's "
     "valid neighbours; Megatron stops at FlashInfer before reaching A2. A2's breaking cases "
     "agree."),
]


def refused_input(megatron):
    """The words one of capscope's refused inputs must contain when Megatron refuses one of the
    rules' inputs before the graph rules (validate_args_inputs.hpp), or None."""
    if megatron.get("raised_at") == "megatron/training/arguments.py:1196":  # bare assert
        return "--fp16 and --bf16 were both given"
    if megatron.get("exception") == "ZeroDivisionError":
        return "the model has no layers"
    text = megatron.get("message", "")
    return text.split(". ")[0].rstrip(".")[:90] or None


def explanation(outcome, megatron, capscope):
    for when, test, reason in EXPLAINED:
        if (when is None or when == outcome) and test(megatron, capscope):
            return reason
    return None


def megatron_rule(verdict):
    """capscope's id for the check that rejected the case, 'usage' or None (unmapped)."""
    if verdict.get("exception") == "SystemExit" and verdict.get("exit_code") == 2:
        return "usage"
    if verdict.get("exception") == "KeyError" and verdict.get("stage") == "parse_args":
        return "N6"  # CudaGraphModule[name] in the --cuda-graph-modules converter
    text = verdict.get("message", "")
    if not text:
        text = verdict.get("raised_at", "")
    for pattern, rule in MEGATRON_RULES:
        if re.search(pattern, text):
            return rule
    return None


def capscope_reason(capscope):
    """capscope's rules, its first refused input, or 'usage' (a parse error)."""
    if capscope.get("refused"):
        return "refused: " + capscope["refused"][0][:70]
    return "+".join(capscope["rules"]) or "usage"


def classify(megatron, capscope):
    """(outcome, detail) where outcome is 'agree' or a disagreement kind."""
    if megatron["accepted"] and capscope["accepted"]:
        mine = (capscope["impl"], sorted(capscope["modules"]), capscope["inference_scope"])
        theirs = (megatron["impl"], sorted(megatron["modules"]), megatron["inference_scope"])
        if mine != theirs:
            return "normalized differently", f"{theirs} vs {mine}"
        if "inputs" in megatron:  # the second set: the rewritten rule inputs agree too
            differ = sorted(k for k, v in megatron["inputs"].items()
                            if capscope.get("inputs", {}).get(k) != v)
            if differ:
                return "rule inputs differ", ", ".join(
                    f"{k}: Megatron {megatron['inputs'][k]!r}, capscope "
                    f"{capscope.get('inputs', {}).get(k)!r}" for k in differ)
        return "agree", "accepted"
    if megatron["accepted"]:
        return "capscope rejects, Megatron accepts", capscope_reason(capscope)
    rule = megatron_rule(megatron)
    refused = refused_input(megatron) if rule is None else None
    if refused and any(refused in r for r in capscope.get("refused", [])):
        return "agree", "input refused: " + refused[:60]
    if capscope["accepted"]:
        return "Megatron rejects, capscope accepts", rule or megatron["message"][:100]
    if rule == "usage":
        return ("agree", "usage") if capscope.get("parse_error") else (
            "Megatron usage error, capscope rule", capscope_reason(capscope))
    if rule is None:
        return "Megatron rejects for an unmapped reason", megatron["message"][:100]
    if rule in capscope["rules"]:
        return "agree", rule
    return "different rule", f"Megatron {rule}, capscope {capscope_reason(capscope)}"


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--cases", help="cases.jsonl (not needed with --recorded)")
    cli.add_argument("--megatron", help="megatron_verdicts.py's output")
    cli.add_argument("--recorded", help="cases and Megatron's verdicts in one file (record.py)")
    mine = cli.add_mutually_exclusive_group(required=True)
    mine.add_argument("--capscope", help="capscope_verdicts.py's output")
    mine.add_argument("--capscope-check", help="run this capscope-check on every case now")
    options = cli.parse_args()
    load = lambda path: {r["id"]: r for r in capscope_verdicts.read_jsonl(path)}
    if options.recorded:
        recorded = load(options.recorded)
        cases = {k: {"id": k, "argv": r["argv"]} for k, r in recorded.items()}
        megatron = {k: r["megatron"] for k, r in recorded.items()}
    else:
        cases, megatron = load(options.cases), load(options.megatron)
    if options.capscope:
        capscope = load(options.capscope)
    else:
        verdicts = capscope_verdicts.all_verdicts(options.capscope_check, list(cases.values()))
        capscope = {r["id"]: r for r in verdicts}

    outcomes = collections.Counter()
    details = collections.defaultdict(collections.Counter)
    examples = {}
    first = collections.Counter()
    reasons = {}
    for number, case in cases.items():
        outcome, detail = classify(megatron[number], capscope[number])
        if outcome != "agree":
            reason = explanation(outcome, megatron[number], capscope[number])
            if reason is None:
                outcome = "UNEXPLAINED: " + outcome
            else:
                reasons[(outcome, detail)] = reason
        outcomes[outcome] += 1
        details[outcome][detail] += 1
        examples.setdefault((outcome, detail), number)
        if outcome == "agree" and detail not in ("accepted", "usage") and \
                not detail.startswith("input refused"):
            first[capscope[number]["rules"][0] == detail] += 1

    print(f"{len(cases)} cases: " + ", ".join(f"{n} {k}" for k, n in outcomes.most_common()))
    print(f"rejected by the same rule: Megatron's rule is capscope's first in {first[True]}, "
          f"a later one in {first[False]}")
    for outcome in outcomes:
        if outcome == "agree":
            continue
        print(f"\n### {outcome}\n")
        for detail, n in details[outcome].most_common():
            case = cases[examples[(outcome, detail)]]
            print(f"- **{n}** × {detail}. Example, case {case['id']}: "
                  f"`{' '.join(shown_argv(case['argv']))}`")
            if (outcome, detail) in reasons:
                print(f"  Why: {reasons[(outcome, detail)]}")
    agreed = details["agree"]
    print("\nagreements by rule: " + ", ".join(f"{k} {n}" for k, n in sorted(agreed.items())))
    unexplained = sum(n for k, n in outcomes.items() if k.startswith("UNEXPLAINED"))
    print(f"\n{unexplained} unexplained disagreement(s)")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
