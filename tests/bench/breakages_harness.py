#!/usr/bin/env python3
"""bench/peers/breakages.py, on the CPU: beside a stand-in peer that reports red for the breakages
it can see, the script refuses a run whose unbroken check did not pass, leaves out breakages of
layer kinds the model lacks, leaves the run's own verdict as it is, and exits 1 with a NOT RED
line for a breakage the check did not catch.

usage: breakages_harness.py SOURCE_ROOT
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import outcome  # tests/bench/outcome.py

root = sys.argv[1]
failed = []

# What the stand-in peer sees: every breakage but the router's (so that one must come out NOT RED).
# The strings are split so that the stand-in's own source does not hold them.
STAND_IN = """import os, sys
here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "gpt_model.py")).read() + open(__file__).read()
seen = ["is_causal=" + "False", "scale=" + "0.5", "lr=" + "1e-3,", "linear_scan(a, " + "u)", "pos < c" + " - 1"]
broken = any(s in src for s in seen)
assert os.path.exists(os.path.join(sys.argv[1], "losses.txt")), "inputs not linked"
open(os.path.join(sys.argv[1], "peer_check.txt"), "w").write("same work: stand-in, largest relative loss difference "
    + ("5.00e-02" if broken else "1.00e-04") + ": " + ("NO" if broken else "yes") + "\\n")
sys.exit(1 if broken else 0)
# the peer's AdamW: lr=1e-4,
"""
MODEL = "is_causal=True)\nlinear_scan(a, (1 - a) * u)\nkept = pos < c\ntorch.topk(logits, k, dim=-1)\n"


def run_dir(tmp, name, pattern, verdict):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    header = json.dumps({"__metadata__": {"layer_pattern": pattern}}).encode()
    open(os.path.join(d, "weights.safetensors"), "wb").write(struct.pack("<Q", len(header)) + header)
    open(os.path.join(d, "losses.txt"), "w").write("5.5\n")
    if verdict:
        open(os.path.join(d, "peer_check.txt"), "w").write(f"same work: the unbroken peer: {verdict}\n")
    return d


with tempfile.TemporaryDirectory() as tmp:
    peers = os.path.join(tmp, "peers")
    os.makedirs(peers)
    shutil.copy(os.path.join(root, "bench", "peers", "breakages.py"), peers)
    open(os.path.join(peers, "gpt_model.py"), "w").write(MODEL)
    open(os.path.join(peers, "gpt_peer.py"), "w").write(STAND_IN)
    script = os.path.join(peers, "breakages.py")

    def breakages(d):
        r = outcome.run(script, d)
        listed = os.path.join(d, "breakages.txt")
        return r, (open(listed).read().splitlines() if os.path.exists(listed) else [])

    # The unbroken check did not pass: refused, nothing written.
    d = run_dir(tmp, "failed", "DDDD", "NO")
    r, lines = breakages(d)
    if r.returncode == 0 or "does not say the unbroken peer passed" not in r.stdout or lines:
        failed.append(f"a run whose check failed was not refused:\n{r.stdout}")

    # Dense: the three attention and optimizer breakages, all red; the run's verdict untouched.
    d = run_dir(tmp, "dense", "DDDD", "yes")
    r, lines = breakages(d)
    if r.returncode != 0 or len(lines) != 3 or not all(": red: " in l for l in lines):
        failed.append(f"dense: want 3 red breakages and exit 0, got exit {r.returncode}:\n" + "\n".join(lines) + "\n" + r.stdout)
    if open(os.path.join(d, "peer_check.txt")).read() != "same work: the unbroken peer: yes\n":
        failed.append("dense: the run's own peer_check.txt was overwritten")

    # Mixed: six breakages; the one the stand-in cannot see comes out NOT RED, and the script exits 1.
    d = run_dir(tmp, "mixed", "EDMD", "yes")
    r, lines = breakages(d)
    not_red = [l for l in lines if "NOT RED" in l]
    if r.returncode != 1 or len(lines) != 6 or len(not_red) != 1 or not not_red[0].startswith("router takes the smallest logits"):
        failed.append(f"mixed: want 5 red, the router's NOT RED and exit 1, got exit {r.returncode}:\n" + "\n".join(lines) + "\n" + r.stdout)

outcome.finish(failed, "breakages.py: refuses a failed check, picks breakages by layer kind, and reports what stays green")
