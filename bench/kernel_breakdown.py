#!/usr/bin/env python3
"""Where one training step's device time goes, capscope beside PyTorch: the kernels of each side's
profiled step (ncu's gpu__time_duration.sum, as bench/profile.sh writes it), summed by what they
do (GEMM, attention, norms, optimizer, ...).

usage: python3 bench/kernel_breakdown.py [--out FILE.md] NAME=NCU_CSV...

NCU_CSV is what `ncu --csv --page raw --metrics gpu__time_duration.sum` (or `--page details`)
wrote. Prints a Markdown table (and writes it to FILE.md): per category, each side's µs and share
of its step, and the kernels that took the most. ncu runs kernels one at a time at its own
clocks, so the sums compare the sides' kernels, not their step times.
"""
import csv
import re
import sys

# What a kernel does, from its name: capscope's kernels (examples/model/src/kernels/), cuBLAS's,
# and PyTorch's (ATen, FlashAttention/cuDNN, Inductor's Triton kernels, named after the ops they fuse).
# First match wins: a fused Triton kernel with rsqrt in it is a norm before it is pointwise.
CATEGORIES = [
    ("attention", r"forward_mma|forward_scalar|key_grads|query_grads|rowdot|flash|fmha|attention|sdpa|_mha|mha_"),
    ("GEMM", r"gemm|xmma|nvjet|cutlass|cublas|splitkreduce|gemv|^sm\d+_|ampere_|hopper_|triton_tem_|_b?mm_|addmm"),
    ("optimizer", r"adam|multi_tensor_apply|foreach|set_hyperparameters|advance_step"),
    ("MoE routing", r"router|topk|assign_slots|permute_rows|combine|moe|sort|scatter(?!_add)"),
    ("scan", r"scan"),
    ("embedding and loss", r"embedding|position|cross_entropy|nll|log_softmax|logsumexp|index_select|indexselect|index_put|"
                           r"indexing|count_valid|gather"),
    ("norms", r"norm|rsqrt"),
    ("pointwise, casts, copies", r"gelu|silu|sigmoid|tanh|cast|copy|add|mul|fill|zero|elementwise|vectorized|triton_|dropout|"
                                 r"sum|reduce|memset|memcpy"),
]
UNIT_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
METRIC = "gpu__time_duration.sum"


def category_of(name):
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def kernels_of(path):
    """[(kernel name, ns)] from an ncu CSV, raw page (a column per metric, maybe a units row) or
    details page (a row per metric)."""
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    rows = list(csv.reader(lines))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        raise SystemExit(f"kernel_breakdown: {path} has no ncu CSV header (a row with 'Kernel Name'): "
                         f"was it written by ncu --csv with --metrics {METRIC}, and did the profiled range hold kernels?")
    cols = rows[head]
    name_at = cols.index("Kernel Name")
    out = []

    def ns(value, unit):
        if unit not in UNIT_NS:
            raise SystemExit(f"kernel_breakdown: {path}: unit {unit!r} of {METRIC} is not one of {', '.join(UNIT_NS)}")
        return float(value.replace(",", "")) * UNIT_NS[unit]

    if "Metric Name" in cols:
        m_at, u_at, v_at = cols.index("Metric Name"), cols.index("Metric Unit"), cols.index("Metric Value")
        for r in rows[head + 1:]:
            if len(r) == len(cols) and r[m_at] == METRIC:
                out.append((r[name_at], ns(r[v_at], r[u_at])))
    elif METRIC in cols:
        at = cols.index(METRIC)
        body = rows[head + 1:]
        unit = "nsecond"
        if body and body[0][name_at] == "":  # the raw page's units row
            unit, body = body[0][at], body[1:]
        for r in body:
            if len(r) == len(cols):
                out.append((r[name_at], ns(r[at], unit)))
    else:
        raise SystemExit(f"kernel_breakdown: {path} has no {METRIC} column or row: profile with --metrics {METRIC}")
    if not out:
        raise SystemExit(f"kernel_breakdown: {path} holds no kernel: did the profiled range (--profile-from-start off) run one step?")
    return out


def breakdown(sides):
    """sides: [(name, [(kernel, ns)])] -> the Markdown table."""
    cats = [c for c, _ in CATEGORIES] + ["other"]
    sums = {name: {c: 0.0 for c in cats} for name, _ in sides}
    counts = {name: {c: 0 for c in cats} for name, _ in sides}
    top = {name: {} for name, _ in sides}
    for name, kernels in sides:
        for k, t in kernels:
            c = category_of(k)
            sums[name][c] += t
            counts[name][c] += 1
            top[name].setdefault(c, {}).setdefault(k, 0.0)
            top[name][c][k] += t
    totals = {name: sum(sums[name].values()) for name, _ in sides}
    head = ["what"] + [f"{n} µs (kernels, share)" for n, _ in sides] + [f"{n}: most time in" for n, _ in sides]
    rows = []
    for c in cats:
        if not any(counts[n][c] for n, _ in sides):
            continue
        cells = [c]
        cells += [f"{sums[n][c] / 1e3:.0f} ({counts[n][c]}, {sums[n][c] / totals[n]:.0%})" if counts[n][c] else "-" for n, _ in sides]
        for n, _ in sides:
            most = sorted(top[n].get(c, {}).items(), key=lambda kv: -kv[1])[:2]
            cells.append(", ".join(f"`{k[:40]}` {t / 1e3:.0f}" for k, t in most) or "-")
        rows.append(cells)
    rows.append(["**all kernels**"] + [f"**{totals[n] / 1e3:.0f}** ({len(k)})" for n, k in sides] + ["" for _ in sides])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(sides) + "---|" * len(sides)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main():
    args, out = sys.argv[1:], None
    if args[:1] == ["--out"] and len(args) > 1:
        out, args = args[1], args[2:]
    if not args or any("=" not in a for a in args):
        raise SystemExit(__doc__)
    sides = [(a.split("=", 1)[0], kernels_of(a.split("=", 1)[1])) for a in args]
    text = breakdown(sides)
    print(text, end="")
    if out:
        open(out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
