#!/usr/bin/env python3
"""Seeded generator of Megatron-LM command lines around every CUDA-graph rule.

Each case is a full command line: a small GPT model that Megatron accepts, plus a random
draw along every dimension the rules read (impl and its legacy spellings, modules and the
deprecated scope values, inference scope, dense or MoE and how MoE routes, recompute,
offloading, training checks, expert-parallel overlap, Megatron-FSDP), and spelling noise
(`--flag=value`, group order). The rules that random draws seldom reach also get targeted
cases: a minimal breaking configuration and its nearest valid neighbour. The same seed gives
the same cases.

`--set beyond` writes the second set instead (beyond_cases.py): flags outside the CUDA-graph
options that validate_args reads or rewrites before the graph rules.

usage: generate_cases.py [--set graph|beyond] [--seed N] [--count N] > cases.jsonl
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import beyond_cases  # noqa: E402
from draws import pick  # noqa: E402

BASE = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "256",
    "--num-attention-heads", "4", "--seq-length", "128", "--max-position-embeddings", "128",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-4",
    "--train-iters", "10", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
    "--mock-data", "--bf16",
]
GRAPH_MODULES = ["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
DEPRECATED_MODULES = ["full", "full_iteration", "full_iteration_inference"]
IMPLS = ["none", "local", "transformer_engine", "full_iteration"]
SCOPES = ["none", "layer", "block"]
RECOMPUTE_MODULES = ["core_attn", "mlp", "moe", "layernorm", "shared_experts", "moe_act"]
OFFLOAD_MODULES = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act", "fused_group_mlp"]
MOE_FREQ = ["1", "2", "([1]*3+[0]*1)", "[1,1,1,1]", "[0,1,0,1]"]


def subset(rng, items, low, high):
    return rng.sample(items, rng.randint(low, min(high, len(items))))


def impl_group(rng):
    kind = pick(rng, [(20, "unset"), (60, "impl"), (7, "enable"), (5, "external"),
                      (2, "both"), (4, "legacy+impl"), (1, "bad")])
    if kind == "unset":
        return []
    if kind == "impl":
        return [["--cuda-graph-impl", rng.choice(IMPLS)]]
    if kind == "enable":
        return [["--enable-cuda-graph"]]
    if kind == "external":
        return [["--external-cuda-graph"]]
    if kind == "both":
        return [["--enable-cuda-graph"], ["--external-cuda-graph"]]
    if kind == "legacy+impl":
        legacy = rng.choice(["--enable-cuda-graph", "--external-cuda-graph"])
        return [[legacy], ["--cuda-graph-impl", rng.choice(IMPLS)]]
    return [["--cuda-graph-impl", "cudagraph"]]


def modules_group(rng):
    kind = pick(rng, [(35, "unset"), (45, "modules"), (10, "deprecated"), (7, "scope"),
                      (1.5, "unknown"), (0.5, "empty")])
    if kind == "unset":
        return []
    if kind == "modules":
        return [["--cuda-graph-modules", *subset(rng, GRAPH_MODULES, 1, 3)]]
    if kind == "deprecated":
        values = subset(rng, GRAPH_MODULES, 0, 2) + subset(rng, DEPRECATED_MODULES, 1, 2)
        rng.shuffle(values)
        return [["--cuda-graph-modules", *values]]
    if kind == "scope":
        values = subset(rng, GRAPH_MODULES + DEPRECATED_MODULES, 1, 2)
        group = [["--cuda-graph-scope", *values]]
        if rng.random() < 0.3:
            group.append(["--cuda-graph-modules", *subset(rng, GRAPH_MODULES, 1, 2)])
        return group
    if kind == "unknown":
        return [["--cuda-graph-modules", "attn", rng.choice(["router", "moe_dispatch", "ATTN"])]]
    return [["--cuda-graph-modules"]]


def scope_group(rng):
    if rng.random() < 0.6:
        return []
    return [["--inference-cuda-graph-scope", rng.choice(SCOPES)]]


def model_group(rng):
    if rng.random() < 0.35:
        return [] if rng.random() < 0.8 else [["--num-experts", "1"]]
    group = [["--num-experts", rng.choice(["4", "8"])], ["--moe-router-topk", "2"]]
    freq = rng.choice(MOE_FREQ)
    if freq != "1" or rng.random() < 0.3:
        group.append(["--moe-layer-freq", freq])
    if rng.random() < 0.5:
        group.append(["--moe-expert-capacity-factor", rng.choice(["1.0", "0.5"])])
        if rng.random() < 0.6:  # Megatron wants a capacity factor for padding
            group.append(["--moe-pad-expert-input-to-capacity"])
    if rng.random() < 0.5:
        group.append(["--moe-token-dispatcher-type", rng.choice(["allgather", "alltoall"])])
    if rng.random() < 0.3:
        group.append(["--moe-shared-expert-intermediate-size", "128"])
    if rng.random() < 0.3:
        group.append(["--moe-grouped-gemm"])
    if rng.random() < 0.15:
        group.append(["--moe-input-jitter-eps", "0.01"])
    return group


def recompute_group(rng):
    kind = pick(rng, [(55, "off"), (5, "activations"), (30, "selective"), (7, "full"),
                      (3, "moe-layer")])
    group = []
    if kind == "activations":
        group.append(["--recompute-activations"])
    elif kind == "selective":
        group.append(["--recompute-granularity", "selective"])
        if rng.random() < 0.85:
            group.append(["--recompute-modules", *subset(rng, RECOMPUTE_MODULES, 1, 3)])
    elif kind == "full":
        group += [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                  ["--recompute-num-layers", "1"]]
    elif kind == "moe-layer":
        group.append(["--moe-layer-recompute"])
    if rng.random() < 0.4:
        group.append(["--attention-dropout", rng.choice(["0.0", "0.1"])])
    if rng.random() < 0.4:
        group.append(["--hidden-dropout", rng.choice(["0.0", "0.1"])])
    return group


def offload_group(rng):
    kind = pick(rng, [(75, "off"), (20, "fine"), (5, "cpu")])
    group = []
    if kind == "fine":
        group.append(["--fine-grained-activation-offloading"])
        if rng.random() < 0.95:
            modules = subset(rng, OFFLOAD_MODULES, 1, 3)
            if rng.random() < 0.02:
                modules.append("embedding")
            group.append(["--offload-modules", *modules])
        if "fused_group_mlp" in str(group) and rng.random() < 0.7:
            group.append(["--use-transformer-engine-op-fuser"])
        if rng.random() < 0.4:
            group.append(["--fine-grained-offloading-max-inflight-offloads",
                          rng.choice(["0", "2", "-1"])])
        if rng.random() < 0.05:
            group.append(rng.choice([["--min-offloaded-tensor-size", "-1"],
                                     ["--activation-offload-fraction", "1.5"],
                                     ["--delta-offload-bytes-across-pp-ranks", "-4"]]))
    elif kind == "cpu":  # Megatron refuses it with recompute; see make_case
        group.append(["--cpu-offloading-num-layers", "1"])
    if rng.random() < 0.2:
        group.append(["--cuda-graph-warmup-steps", rng.choice(["0", "1", "3"])])
    return group


def training_group(rng):
    group = []
    if rng.random() < 0.6:
        group.append(["--no-check-for-nan-in-loss-and-grad"])
    if rng.random() < 0.1:
        group.append(["--inference-dynamic-batching-num-cuda-graphs",
                      rng.choice(["0", "-1", "-2", "4"])])
    if rng.random() < 0.03:
        group += [["--inference-batch-times-seqlen-threshold", "512"],
                  ["--pipeline-model-parallel-size", "2"]]
    if rng.random() < 0.1:
        group.append(["--transformer-impl", "local"])
    if rng.random() < 0.04:  # rule A2; MoE fp8 needs Transformer Engine (see compare.py)
        group.append(["--fp8-format", "hybrid"])
        if rng.random() < 0.5:
            group.append(["--moe-router-padding-for-fp8"])
    return group


def parallel_group(rng):
    group = []
    if rng.random() < 0.06:
        group += [["--overlap-moe-expert-parallel-comm"], ["--expert-model-parallel-size", "2"],
                  ["--moe-token-dispatcher-type", "alltoall"], ["--num-experts", "8"]]
    if rng.random() < 0.06:
        group.append(["--use-megatron-fsdp"])
        group.append(["--ckpt-format", "fsdp_dtensor"])
        group.append(["--data-parallel-sharding-strategy", "optim_grads_params"])
        for flag in ["--fsdp-double-buffer", "--fsdp-db-use-persist-buf-on-alloc-fail",
                     "--use-nccl-ub", "--megatron-fsdp-max-pool-double-buffer"]:
            if rng.random() < 0.3:
                group.append([flag])
        if rng.random() < 0.2:
            group.append(["--megatron-fsdp-version", "2"])
    return group


# Rules that random draws reach rarely: a minimal breaking configuration and its nearest valid
# neighbour, each drawn several times with the groups shuffled and spelled differently.
DROP_AND_PAD = "--num-experts 4 --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity"
OFFLOAD = "--fine-grained-activation-offloading --offload-modules"
TARGETED = {
    "R2": ("--cuda-graph-impl transformer_engine --cuda-graph-modules moe_router --num-experts 4 "
           "--recompute-granularity selective --recompute-modules moe --hidden-dropout 0.0",
           "--cuda-graph-impl local --cuda-graph-modules moe_router --num-experts 4 "
           "--recompute-granularity selective --recompute-modules moe --hidden-dropout 0.0"),
    "R5": ("--cuda-graph-impl transformer_engine --num-experts 4 --moe-input-jitter-eps 0.01 "
           "--recompute-granularity selective --recompute-modules moe --hidden-dropout 0.0",
           "--cuda-graph-impl transformer_engine --cuda-graph-modules attn --num-experts 4 "
           "--moe-input-jitter-eps 0.01 --recompute-granularity selective --recompute-modules moe "
           "--hidden-dropout 0.0"),
    "S7": ("--cuda-graph-impl transformer_engine --num-experts 4 --moe-token-dispatcher-type alltoall "
           "--moe-expert-capacity-factor 1.0 --cuda-graph-modules moe_router moe_preprocess",
           f"--cuda-graph-impl transformer_engine {DROP_AND_PAD} --moe-token-dispatcher-type alltoall "
           "--cuda-graph-modules moe_router moe_preprocess"),
    "E1": (f"--cuda-graph-impl transformer_engine --cuda-graph-modules moe {DROP_AND_PAD} "
           "--overlap-moe-expert-parallel-comm --expert-model-parallel-size 2 "
           "--moe-token-dispatcher-type alltoall",
           f"--cuda-graph-impl transformer_engine --cuda-graph-modules attn {DROP_AND_PAD} "
           "--overlap-moe-expert-parallel-comm --expert-model-parallel-size 2 "
           "--moe-token-dispatcher-type alltoall"),
    "O1": (f"{OFFLOAD} core_attn --cpu-offloading-num-layers 1", f"{OFFLOAD} core_attn"),
    "OC2": (f"--cuda-graph-impl local --num-experts 4 {OFFLOAD} moe_act",
            f"--cuda-graph-impl local --num-experts 4 --cuda-graph-modules moe_router {OFFLOAD} moe_act"),
    "OC3": (f"--cuda-graph-impl local {DROP_AND_PAD} --cuda-graph-modules moe {OFFLOAD} moe_act",
            f"--cuda-graph-impl local {DROP_AND_PAD} --cuda-graph-modules moe_router {OFFLOAD} moe_act"),
    "OC4": (f"--cuda-graph-impl transformer_engine {DROP_AND_PAD} --cuda-graph-modules moe {OFFLOAD} moe_act",
            f"--cuda-graph-impl transformer_engine {DROP_AND_PAD} --cuda-graph-modules moe_router "
            f"{OFFLOAD} moe_act"),
    "OC5": (f"--cuda-graph-impl transformer_engine --cuda-graph-modules attn {OFFLOAD} core_attn "
            "--cuda-graph-warmup-steps 0",
            f"--cuda-graph-impl transformer_engine --cuda-graph-modules attn {OFFLOAD} core_attn "
            "--cuda-graph-warmup-steps 1"),
    "OC6": (f"--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad {OFFLOAD} core_attn",
            f"--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad {OFFLOAD} core_attn "
            "--fine-grained-offloading-max-inflight-offloads 0"),
    "A2": ("--cuda-graph-impl local --inference-cuda-graph-scope block --fp8-format hybrid",
           "--cuda-graph-impl local --inference-cuda-graph-scope block --fp8-format hybrid "
           "--fp8-recipe mxfp8 --transformer-impl inference_optimized"),
    "R0": ("--recompute-granularity selective --recompute-modules core_attn attention",
           "--recompute-granularity selective --recompute-modules core_attn"),
}
TARGETED_DRAWS = 12

# The second set's targeted pairs: a rewrite in validate_args decides a graph rule.
TARGETED_BEYOND = {
    "A1": ("--cuda-graph-impl full_iteration --fp16 --loss-scale 1024",
           "--cuda-graph-impl full_iteration --fp16"),  # dynamic scaling turns the check off
    "A6": ("--inference-batch-times-seqlen-threshold 512 --pipeline-model-parallel-size 2 "
           "--cuda-graph-impl local --bf16",
           "--inference-batch-times-seqlen-threshold 512 --pipeline-model-parallel-size 2 "
           "--cuda-graph-impl none --bf16"),
    "R1": ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
           "--cuda-graph-impl local --bf16",
           "--recompute-activations --recompute-granularity full --cuda-graph-impl local --bf16"),
    "S5": ("--num-experts 4 --moe-layer-freq [1]*4 --cuda-graph-impl local --cuda-graph-modules mlp "
           "--bf16",
           "--num-experts 4 --moe-layer-freq ([1]*3+[0]*1) --cuda-graph-impl local "
           "--cuda-graph-modules mlp --bf16"),
}


def flag_groups(text):
    """'--a 1 --b --c x y' -> [['--a', '1'], ['--b'], ['--c', 'x', 'y']]"""
    groups = []
    for word in text.split():
        if word.startswith("--"):
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def spell(rng, flag_group):
    """`--flag value` or `--flag=value` for single-valued flags, as argparse allows both."""
    if len(flag_group) == 2 and rng.random() < 0.3:
        return [f"{flag_group[0]}={flag_group[1]}"]
    return flag_group


def satisfy_preconditions(groups):
    """Megatron rules outside CUDA graphs that a draw may break: the case is changed so that
    they hold, since a rejection for them says nothing about the graph rules."""
    flags = {group[0] for group in groups}
    recomputed = next((g[1:] for g in groups if g[0] == "--recompute-modules"), [])
    if "moe_act" in recomputed and "--moe-grouped-gemm" not in flags:
        groups.append(["--moe-grouped-gemm"])  # TransformerConfig: moe_act needs grouped GEMM
    recompute_flags = ("--recompute-activations", "--recompute-granularity", "--recompute-modules",
                       "--recompute-method", "--recompute-num-layers", "--moe-layer-recompute")
    if "--cpu-offloading-num-layers" in flags:  # TransformerConfig: no recompute with it
        groups[:] = [g for g in groups if g[0] not in recompute_flags]
    if "--overlap-moe-expert-parallel-comm" in flags:
        # TransformerConfig: expert-parallel overlap allows neither full nor moe recompute,
        # and needs virtual pipelining under pipeline parallelism
        if "moe" in recomputed or any(g[:2] == ["--recompute-granularity", "full"] for g in groups) \
                or "--moe-layer-recompute" in flags:
            groups[:] = [g for g in groups if g[0] not in recompute_flags]
        groups[:] = [g for g in groups if g[0] not in (
            "--pipeline-model-parallel-size", "--inference-batch-times-seqlen-threshold")]
    if "--fp8-format" in flags:  # fp8's own rules: delayed scaling recomputes neither of these
        for g in groups:
            if g[0] == "--recompute-modules":
                g[1:] = [m for m in g[1:] if m not in ("moe_act", "layernorm")] or ["core_attn"]
    if "--moe-router-padding-for-fp8" in flags:  # only the alltoall dispatcher pads
        groups[:] = [g for g in groups if g[0] != "--moe-token-dispatcher-type"]
        groups.append(["--moe-token-dispatcher-type", "alltoall"])
    if "--cpu-offloading-num-layers" in flags:  # TransformerConfig: not with pipelining
        groups[:] = [g for g in groups if g[0] not in (
            "--pipeline-model-parallel-size", "--inference-batch-times-seqlen-threshold")]
    return groups


def make_targeted_case(rng, number, text, base=BASE):
    groups = flag_groups(text)
    rng.shuffle(groups)
    argv = list(base)
    for group in groups:
        argv += spell(rng, group)
    return {"id": number, "argv": argv}


def make_case(rng, number):
    groups = []
    for make in (impl_group, modules_group, scope_group, model_group, recompute_group,
                 offload_group, training_group):
        groups += make(rng)
    rng.shuffle(groups)
    groups += parallel_group(rng)  # last, so its expert count and dispatcher win
    argv = list(BASE)
    for group in satisfy_preconditions(groups):
        argv += spell(rng, group)
    return {"id": number, "argv": argv}


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--set", choices=["graph", "beyond"], default="graph")
    cli.add_argument("--seed", type=int, default=20261122)
    cli.add_argument("--count", type=int, default=None, help="random cases (4000; beyond: 3000)")
    options = cli.parse_args()
    rng = random.Random(options.seed)
    beyond = options.set == "beyond"
    count = options.count if options.count is not None else (3000 if beyond else 4000)
    for number in range(count):
        case = beyond_cases.make_case(rng, number, spell) if beyond else make_case(rng, number)
        print(json.dumps(case))
    number = count
    targeted, base = ((TARGETED_BEYOND, beyond_cases.BASE_WITHOUT_PRECISION) if beyond
                      else (TARGETED, BASE))
    for rule, pair in targeted.items():
        for text in pair:
            for _ in range(TARGETED_DRAWS):
                case = {**make_targeted_case(rng, number, text, base), "around": rule}
                print(json.dumps({**case, "set": "beyond"} if beyond else case))
                number += 1


if __name__ == "__main__":
    main()
