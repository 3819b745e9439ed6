#!/usr/bin/env python3
"""The data-parallel bench's table: bench/data_parallel.cpp's CSV (rows of 1 and of 2 GPUs) as
Markdown, with the weak-scaling efficiency (1-GPU step time / 2-GPU step time: the same batch
per GPU, so 100% means the collectives cost nothing) and memory per rank side by side.

    python3 bench/data_parallel_table.py data_parallel.csv > table.md
"""
import csv
import sys


def main(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"{path}: no rows")
    by = {(r["mode"], r["impl"], int(r["gpus"])): r for r in rows}
    gpus = sorted({int(r["gpus"]) for r in rows})
    if len(gpus) < 2:
        sys.exit(f"{path}: rows for {gpus} GPU(s) only; run the bench with mpirun -np 1 and -np 2")
    lo, hi = gpus[0], gpus[-1]
    print(f"Device: {rows[0]['device']}, {hi} GPUs of one host (NCCL, one process per GPU).\n")
    print(f"| mode | impl | step ms, {lo} GPU | step ms, {hi} GPUs | weak scaling | host µs/step ({hi}) "
          f"| device MiB/rank ({lo} → {hi}) | params + optimizer MiB/rank ({lo} → {hi}) | tokens/s ({hi}) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    keys = []
    for r in rows:
        k = (r["mode"], r["impl"])
        if k not in keys:
            keys.append(k)
    for mode, impl in keys:
        a, b = by.get((mode, impl, lo)), by.get((mode, impl, hi))
        if not (a and b):
            continue
        eff = float(a["step_ms"]) / float(b["step_ms"])
        print(f"| {mode} | {impl} | {float(a['step_ms']):.2f} | {float(b['step_ms']):.2f} | {eff:.1%} | {float(b['host_us']):.0f} "
              f"| {float(a['device_mib_per_rank']):.0f} → {float(b['device_mib_per_rank']):.0f} "
              f"| {float(a['state_mib_per_rank']):.0f} → {float(b['state_mib_per_rank']):.0f} | {float(b['tokens_per_s']):.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
