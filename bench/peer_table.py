#!/usr/bin/env python3
"""One table from bench/same_model and bench/peers/gpt_peer.py runs: per size, capscope's step
time under each way to run it beside every PyTorch variant's, all from one run.

usage: python3 bench/peer_table.py OUT.md OUT.csv DIR...   (each DIR: peer-h<H>-s<S>-b<B>-L<L>, with capscope.csv, peer.csv, peer_check.txt)
"""
import csv
import os
import sys


def size_of(d):
    """'h512 s128 b1 L24' from bench/run_all.sh's directory name peer-h512-s128-b1-L24."""
    return " ".join(os.path.basename(d.rstrip("/")).split("-")[1:])


def read(path):
    return {r["variant"]: float(r["ms"]) for r in csv.DictReader(open(path))}


md_path, csv_path, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
for d in dirs:
    ours, theirs = read(f"{d}/capscope.csv"), read(f"{d}/peer.csv")
    check = open(f"{d}/peer_check.txt").read().strip().splitlines()[-1]
    rows.append((size_of(d), ours, theirs, check))
ours_names = list(rows[0][1])
theirs_names = list(rows[0][2])
head = ["size"] + [f"capscope {n}" for n in ours_names] + [f"PyTorch {n}" for n in theirs_names] + ["capscope whole step / PyTorch best"]
lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
with open(csv_path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["size", "side", "variant", "ms"])
    for size, ours, theirs, _ in rows:
        best = min(theirs.values())
        cells = [size] + [f"{ours[n]:.2f}" for n in ours_names] + [f"{theirs[n]:.2f}" for n in theirs_names]
        cells.append(f"{ours['whole-step graph'] / best:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
        for n in ours_names:
            w.writerow([size, "capscope", n, ours[n]])
        for n in theirs_names:
            w.writerow([size, "pytorch", n, theirs[n]])
lines.append("")
lines += [f"- {size}: {check}" for size, _, _, check in rows]
open(md_path, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
