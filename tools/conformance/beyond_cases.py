"""The second conformance set: flags outside the CUDA-graph options that Megatron's
validate_args reads or rewrites before the graph rules run (generate_cases.py --set beyond).

Each case is the base model with its precision left open, one draw of the graph options that
read the rewritten values (impl, modules, the NaN check, inference, dropouts), and one draw
along each of four dimensions:
- precision and loss scaling: fp32, --bf16, --fp16 with dynamic or constant loss scaling
  (dynamic scaling turns Megatron's NaN check off, which rule A1 reads), both, and the
  grad-reduction flags bf16 rewrites;
- the layer pattern: every accepted spelling of --moe-layer-freq (integers, strings, Python
  list expressions) and spellings argparse refuses, and hybrid patterns
  (--hybrid-layer-pattern, the deprecated --hybrid-override-pattern, pipes, MTP depths), which
  replace --num-layers;
- pipeline and virtual-pipeline sizes (layers per virtual stage, stages per rank, uneven first
  and last stages, layer counts the pipeline size does not divide), which inference and CPU
  offloading read;
- recompute granularity and method (full, selective, --recompute-activations over an explicit
  granularity, layer counts per pipeline rank).
Invalid draws are kept on purpose, at a lower weight: capscope-check must refuse what Megatron
refuses before the graph rules, not only agree on the graph rules.
"""
from draws import pick

BASE_WITHOUT_PRECISION = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "256",
    "--num-attention-heads", "4", "--seq-length", "128", "--max-position-embeddings", "128",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-4",
    "--train-iters", "10", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
    "--mock-data",
]
MODULES = ["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
RECOMPUTE_MODULES = ["core_attn", "mlp", "moe", "layernorm", "shared_experts"]

# --moe-layer-freq as users spell it: (weight, value). argparse refuses "(2)", "1*2", " 2"
# (int() does not evaluate); Megatron's list grammar takes any digits, empty lists and short or
# long patterns (the length is checked only when the layers are built).
MOE_FREQ = [(6, "1"), (6, "2"), (3, "3"), (2, "4"), (1, "8"), (6, "([1]*3+[0]*1)"),
            (4, "[1,0]*2"), (3, "([0]+[1]*3)"), (4, "[1]*4"), (3, "[0]*4"), (3, "[1,1,1,1]"),
            (2, "[0,1,0,1]"), (1, "[1,1,1]"), (1, "[1]*8"), (1, "[2,1,1,1]"), (1, "[]"),
            (1, "(2)"), (1, "1*2"), (1, "0"), (1, "-1"), (1, "[1,0]*2+[1]*0"), (1, "02")]
# Hybrid layer patterns: M mamba, * attention, - MLP, E MoE, | pipeline stage, / MTP depth.
HYBRID = [(5, "M*-E"), (4, "M-M-"), (3, "MMMM"), (3, "*-*-*-"), (3, "M*M*M*M*"), (3, "M*|-E"),
          (2, "M*-|M*-|M*-|M*-"), (2, "M*-E/M-"), (1, "M*-E/M-/M-"), (1, "M*X-"), (1, "")]


def precision_group(rng):
    kind = pick(rng, [(25, "bf16"), (15, "fp16 dynamic"), (12, "fp16 constant"),
                      (6, "fp16 initial"), (14, "fp32"), (4, "both"), (6, "bf16 scale"),
                      (6, "bf16 reduce"), (2, "fp16 fp32 residual")])
    if kind == "bf16":
        return [["--bf16"]]
    if kind == "fp16 dynamic":
        return [["--fp16"]]
    if kind == "fp16 constant":
        return [["--fp16"], ["--loss-scale", rng.choice(["1024", "65536", "1", "0.5"])]]
    if kind == "fp16 initial":
        group = [["--fp16"], ["--initial-loss-scale", rng.choice(["4096", "65536"])]]
        if rng.random() < 0.5:
            group += [["--min-loss-scale", "1"], ["--loss-scale-window", "500"],
                      ["--hysteresis", "2"]]
        return group
    if kind == "fp32":
        return []
    if kind == "both":
        return [["--fp16"], ["--bf16"]]
    if kind == "bf16 scale":  # loss scaling is fp16's; bf16 keeps the NaN check
        return [["--bf16"], ["--loss-scale", "1024"]]
    if kind == "bf16 reduce":
        return [["--bf16"], [rng.choice(["--accumulate-allreduce-grads-in-fp32",
                                         "--grad-reduce-in-bf16"])]]
    return [["--fp16"], ["--fp32-residual-connection"]]


def layer_pattern_group(rng):
    kind = pick(rng, [(30, "dense"), (45, "moe freq"), (25, "hybrid")])
    if kind == "dense":
        return [] if rng.random() < 0.8 else [["--num-experts", "1"]]
    if kind == "moe freq":
        group = [["--num-experts", rng.choice(["4", "8"])], ["--moe-router-topk", "2"],
                 ["--moe-layer-freq", pick(rng, MOE_FREQ)]]
        if rng.random() < 0.4:
            group += [["--moe-expert-capacity-factor", "1.0"],
                      ["--moe-pad-expert-input-to-capacity"]]
        return group
    flag = pick(rng, [(3, "--hybrid-layer-pattern"), (2, "--hybrid-override-pattern"),
                      (0.3, "both")])
    pattern = pick(rng, HYBRID)
    if flag == "both":
        group = [["--hybrid-layer-pattern", pattern], ["--hybrid-override-pattern", pattern]]
    else:
        group = [[flag, pattern]]
    if "E" in pattern or rng.random() < 0.2:
        group += [["--num-experts", "4"], ["--moe-router-topk", "2"]]
    if "/" in pattern and rng.random() < 0.8:  # MTP depths need positions from rope or none;
        # rope fusion needs Transformer Engine, which the conformance machine does not have
        group += [["--position-embedding-type", "rope"], ["--no-rope-fusion"]]
    return group


def pipeline_group(rng):
    kind = pick(rng, [(40, "none"), (15, "pp2"), (8, "pp4"), (8, "vpp layers"),
                      (6, "vpp stages"), (4, "uneven"), (3, "odd layers"), (2, "vpp without pp"),
                      (2, "vpp both"), (3, "pp1")])
    if kind == "none":
        return []
    if kind == "pp2":
        return [["--pipeline-model-parallel-size", "2"]]
    if kind == "pp4":
        return [["--pipeline-model-parallel-size", "4"]]
    if kind == "vpp layers":
        return [["--pipeline-model-parallel-size", "2"],
                ["--num-layers-per-virtual-pipeline-stage", rng.choice(["1", "2", "3"])]]
    if kind == "vpp stages":
        return [["--pipeline-model-parallel-size", "2"],
                ["--num-virtual-stages-per-pipeline-rank", rng.choice(["2", "1"])]]
    if kind == "uneven":
        return [["--pipeline-model-parallel-size", "2"],
                [rng.choice(["--decoder-first-pipeline-num-layers",
                             "--decoder-last-pipeline-num-layers"]), rng.choice(["1", "3"])]]
    if kind == "odd layers":  # the last --num-layers wins
        return [["--pipeline-model-parallel-size", "2"], ["--num-layers", "3"]]
    if kind == "vpp without pp":
        return [["--num-layers-per-virtual-pipeline-stage", "1"]]
    if kind == "vpp both":
        return [["--pipeline-model-parallel-size", "2"],
                ["--num-layers-per-virtual-pipeline-stage", "1"],
                ["--num-virtual-stages-per-pipeline-rank", "2"]]
    return [["--pipeline-model-parallel-size", "1"]]


def recompute_group(rng):
    kind = pick(rng, [(35, "off"), (10, "activations"), (18, "selective"), (15, "full"),
                      (4, "full no method"), (4, "full no layers"), (4, "selective layers"),
                      (5, "activations over full"), (5, "selective method")])
    if kind == "off":
        return []
    if kind == "activations":
        return [["--recompute-activations"]]
    if kind == "selective":
        group = [["--recompute-granularity", "selective"]]
        if rng.random() < 0.7:
            group.append(["--recompute-modules",
                          *rng.sample(RECOMPUTE_MODULES, rng.randint(1, 2))])
        return group
    full = [["--recompute-granularity", "full"]]
    method = ["--recompute-method", rng.choice(["uniform", "block"])]
    layers = ["--recompute-num-layers", rng.choice(["1", "2", "4"])]
    if kind == "full":
        return full + [method, layers]
    if kind == "full no method":
        return full + [layers]
    if kind == "full no layers":
        return full + [method]
    if kind == "selective layers":
        return [["--recompute-granularity", "selective"], ["--recompute-num-layers", "1"]]
    if kind == "activations over full":  # validate_args: --recompute-activations wins
        return [["--recompute-activations"], *full, method, layers]
    return [["--recompute-granularity", "selective"], method]


def graph_group(rng):
    """The graph options that read the rewritten values."""
    group = []
    impl = pick(rng, [(12, None), (12, "none"), (22, "local"), (28, "transformer_engine"),
                      (26, "full_iteration")])
    if impl is not None:
        group.append(["--cuda-graph-impl", impl])
    if impl in ("local", "transformer_engine") and rng.random() < 0.55:
        group.append(["--cuda-graph-modules", *rng.sample(MODULES, rng.randint(1, 2))])
    if rng.random() < 0.45:
        group.append(["--no-check-for-nan-in-loss-and-grad"])
    if rng.random() < 0.12:
        group.append(["--inference-cuda-graph-scope", rng.choice(["none", "layer", "block"])])
    if rng.random() < 0.06:
        group.append(["--inference-batch-times-seqlen-threshold", "512"])
    if rng.random() < 0.05:
        group.append(["--cpu-offloading-num-layers", "1"])
    for flag in ("--attention-dropout", "--hidden-dropout"):
        if rng.random() < 0.3:
            group.append([flag, rng.choice(["0.0", "0.1"])])
    return group


def satisfy_preconditions(groups):
    """Keeps the precondition failures this set is not about: the generator's other rules
    (grouped GEMM for moe_act, no recompute with layer-level CPU offloading) stay satisfied,
    so a rejection says something about the four dimensions or the graph rules."""
    flags = {group[0] for group in groups}
    if "--cpu-offloading-num-layers" in flags:
        groups[:] = [g for g in groups if not g[0].startswith("--recompute")]
    return groups


def make_case(rng, number, spell):
    groups = []
    for make in (precision_group, layer_pattern_group, pipeline_group, recompute_group,
                 graph_group):
        groups += make(rng)
    rng.shuffle(groups)
    argv = list(BASE_WITHOUT_PRECISION)
    for group in satisfy_preconditions(groups):
        argv += spell(rng, group)
    return {"id": number, "argv": argv, "set": "beyond"}
