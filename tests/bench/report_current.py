#!/usr/bin/env python3
"""bench/report.py: docs/performance.md's tables and docs/bench/run_all-h100.{csv,md,svg} are what
it makes from the committed runs (docs/bench/runs/*), and it refuses bad input with a message.

usage: report_current.py SOURCE_ROOT
"""
import filecmp
import glob
import os
import shutil
import sys
import tempfile

import outcome  # tests/bench/outcome.py

root = sys.argv[1]
report = os.path.join(root, "bench", "report.py")
runs = sorted(glob.glob(os.path.join(root, "docs", "bench", "runs", "*")))
failed = []


def run(*args):
    return outcome.run(report, *args)


with tempfile.TemporaryDirectory() as tmp:
    docs = os.path.join(tmp, "performance.md")
    shutil.copy(os.path.join(root, "docs", "performance.md"), docs)
    r = run("--out", os.path.join(tmp, "out"), "--docs", docs, *runs)
    if r.returncode != 0:
        failed.append(f"report.py over {runs} failed:\n{r.stdout}")
    else:
        if not filecmp.cmp(docs, os.path.join(root, "docs", "performance.md"), shallow=False):
            failed.append("docs/performance.md is stale: run python3 bench/report.py --out /tmp/report "
                          "--docs docs/performance.md docs/bench/runs/*, then copy /tmp/report/results.{csv,md,svg} to docs/bench/run_all-h100.*")
        for ext in ("csv", "md", "svg"):
            if not filecmp.cmp(os.path.join(tmp, "out", f"results.{ext}"), os.path.join(root, "docs", "bench", f"run_all-h100.{ext}"), shallow=False):
                failed.append(f"docs/bench/run_all-h100.{ext} is not what report.py makes from docs/bench/runs")

    # A docs file without a table's markers: refused, naming the marker and the fix.
    bare = os.path.join(tmp, "bare.md")
    open(bare, "w").write("# no markers\n")
    r = run("--out", os.path.join(tmp, "out2"), "--docs", bare, *runs)
    if r.returncode == 0 or "<!-- report:same-model -->" not in r.stdout or "add one where the table belongs" not in r.stdout:
        failed.append(f"a docs file without markers was not refused with the marker's name:\n{r.stdout}")

    # A run with one part only: the other blocks keep their text, and the report says so.
    part = os.path.join(tmp, "part")
    os.makedirs(part)
    shutil.copy(os.path.join(runs[0], "compile_time.csv"), part)
    shutil.copy(os.path.join(runs[0], "machine.txt"), part)
    kept = os.path.join(tmp, "kept.md")
    open(kept, "w").write("<!-- report:same-model -->\nOLD\n<!-- /report:same-model -->\n"
                          + "".join(f"<!-- report:{n} -->\n<!-- /report:{n} -->\n" for n in ("runner-overhead", "exec-update", "inference-scope", "compile-time")))
    r = run("--out", os.path.join(tmp, "out3"), "--docs", kept, part)
    text = open(kept).read()
    if r.returncode != 0 or "OLD" not in text or "| g++ |" not in text or "keeps its old text" not in r.stdout:
        failed.append(f"a partial run did not keep the other blocks, or did not fill compile-time:\n{r.stdout}\n{text}")

    # A peer run broken on purpose (bench/peers/breakages.py): each breakage under its case's check.
    broke = os.path.join(tmp, "broke")
    peer = os.path.join(broke, "peer-h512-s128-b1-L24-dense")
    shutil.copytree(os.path.join(runs[0], os.path.basename(peer)), peer)
    open(os.path.join(peer, "breakages.txt"), "w").write(
        "attention without its causal mask: red: same work: 10 steps from the same weights and batches, largest relative "
        "loss difference 5.12e-02 (tolerance 0.02), first step's gradients within 1.09e+00 (tolerance 0.05): NO\n"
        "AdamW learning rate x10: NOT RED (exit 0): same work: ...: yes\n")
    r = run("--out", os.path.join(tmp, "out6"), broke)
    md = open(os.path.join(tmp, "out6", "results.md")).read() if r.returncode == 0 else r.stdout
    for want in ("  - broken on purpose, attention without its causal mask: **red** (loss 5.12e-02, gradients 1.09e+00)\n",
                 "  - broken on purpose, AdamW learning rate x10: **NOT RED (exit 0)**"):
        if want not in md:
            failed.append(f"a breakage line did not come out as {want!r}:\n{md}")

    # No figures at all: refused.
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    r = run("--out", os.path.join(tmp, "out4"), empty)
    if r.returncode == 0 or "no figures" not in r.stdout:
        failed.append(f"a run without figures was not refused:\n{r.stdout}")

    # A run given twice (each figure twice), and a run that is not there: refused.
    for args, want in (([runs[0], runs[0]], "give each figure once"), ([os.path.join(tmp, "nowhere")], "is not a directory")):
        r = run("--out", os.path.join(tmp, "out5"), *args)
        if r.returncode == 0 or want not in r.stdout:
            failed.append(f"report.py {args} was not refused with '{want}':\n{r.stdout}")

outcome.finish(failed, "report.py: the docs are current, and bad input is refused")
