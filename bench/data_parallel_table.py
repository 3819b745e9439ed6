#!/usr/bin/env python3
"""The data-parallel bench's table: bench/data_parallel.cpp's CSV (rows of 1 and of 2 GPUs) as
Markdown, one row per variant and GPU count past the least (1 → 2, 1 → 4), with the weak-scaling
efficiency (1-GPU step time / n-GPU step time: the same batch per GPU, so 100% means the
collectives cost nothing), the host's time per step, and memory per rank side by side.

A second efficiency divides by the 1-GPU step without collectives: a data-parallel trainer on one
rank reduces nothing (the sum or average of one rank is its own gradients), so the median of the
data-parallel variants' 1-GPU steps under the same impl is the model's step alone. A sharded
variant's own 1-GPU step still copies its shards to and from the full buffers, which flatters its
first efficiency; the second is what the collectives cost against training on one GPU.

A second table says where the time went, from each variant's steps traced after the timed ones
(CUPTI, the rank with the longest traced step; tracing slows steps, so its spans exceed the table's
step times): compute kernels busy, and how much more than one GPU without collectives (compute
slowed: the sums of a reduction, and kernels sharing SMs and memory with the collectives);
communication kernels (NCCL's, and capscope_mem_ops, which runs the waits that order its
copy-engine collectives in graph copies) with no compute beside them (exposed); time with no kernel
running, and how much more than on one GPU (idle); and copies (copy-engine collectives among them),
with how much of them no kernel overlaps. A wait left as a memory-operation node is not traced: it
shows as idle where the same wait run as capscope_mem_ops shows as communication. The references
are the medians of the data-parallel variants' 1-GPU traces under the same impl, each on its own.

    python3 bench/data_parallel_table.py data_parallel.csv > table.md
"""
import csv
import statistics
import sys


def main(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"{path}: no rows")
    by = {(r["mode"], r["impl"], int(r["gpus"])): r for r in rows}
    gpus = sorted({int(r["gpus"]) for r in rows})
    if len(gpus) < 2:
        sys.exit(f"{path}: rows for {gpus} GPU(s) only; run the bench with mpirun -np 1 and -np 2")
    lo = gpus[0]
    print(f"Device: {rows[0]['device']}, up to {gpus[-1]} GPUs of one host (NCCL, one process per GPU).\n")
    alone = {}
    for impl in {r["impl"] for r in rows}:
        steps = sorted(float(r["step_ms"]) for r in rows
                       if int(r["gpus"]) == 1 and r["impl"] == impl and r["mode"].startswith("data parallel"))
        if steps:
            alone[impl] = steps[len(steps) // 2]
    print(f"| mode | impl | GPUs | step ms, {lo} GPU | step ms | weak scaling | against 1 GPU without collectives "
          f"| host µs/step ({lo} → n) | device MiB/rank ({lo} → n) | params + optimizer MiB/rank ({lo} → n) | tokens/s (n) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = []
    for r in rows:
        k = (r["mode"], r["impl"])
        if k not in keys:
            keys.append(k)
    for mode, impl in keys:
        for hi in gpus[1:]:
            a, b = by.get((mode, impl, lo)), by.get((mode, impl, hi))
            if not (a and b):
                continue
            eff = float(a["step_ms"]) / float(b["step_ms"])
            bare = f"{alone[impl] / float(b['step_ms']):.1%} ({alone[impl]:.2f})" if lo == 1 and impl in alone else "-"
            print(f"| {mode} | {impl} | {lo} → {hi} | {float(a['step_ms']):.2f} | {float(b['step_ms']):.2f} | {eff:.1%} | {bare} "
                  f"| {float(a['host_us']):.0f} → {float(b['host_us']):.0f} "
                  f"| {float(a['device_mib_per_rank']):.0f} → {float(b['device_mib_per_rank']):.0f} "
                  f"| {float(a['state_mib_per_rank']):.0f} → {float(b['state_mib_per_rank']):.0f} | {float(b['tokens_per_s']):.0f} |")

    traced = [r for r in rows if r.get("traced_span_ms")]
    if not traced:
        return
    alone_traced = {}
    for impl in {r["impl"] for r in traced}:
        ones = [r for r in traced if int(r["gpus"]) == 1 and r["impl"] == impl and r["mode"].startswith("data parallel")]
        if ones:
            alone_traced[impl] = (statistics.median(float(r["compute_ms"]) for r in ones),
                                  statistics.median(float(r["idle_ms"]) for r in ones))
    print(f"\nWhere a traced step's time goes (ms per step; the rank with the longest traced step; against one GPU without "
          f"collectives, the median of the data-parallel variants' 1-GPU traces under the same impl):\n")
    print("| mode | impl | GPUs | traced span | compute busy | compute slowed | communication kernels | exposed | no kernel running | idle added "
          "| copies | copies, no kernel beside |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, impl in keys:
        for n in gpus:
            r = by.get((mode, impl, n))
            if not r or not r.get("traced_span_ms"):
                continue
            compute, idle = float(r["compute_ms"]), float(r["idle_ms"])
            ref = alone_traced.get(impl)
            slowed = f"{compute - ref[0]:+.3f}" if ref and n > 1 else "-"
            added = f"{idle - ref[1]:+.3f}" if ref and n > 1 else "-"
            print(f"| {mode} | {impl} | {n} | {float(r['traced_span_ms']):.3f} | {compute:.3f} | {slowed} | {float(r['communication_ms']):.3f} "
                  f"| {float(r['exposed_ms']):.3f} | {idle:.3f} | {added} | {float(r['copies_ms']):.3f} | {float(r['copies_alone_ms']):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
