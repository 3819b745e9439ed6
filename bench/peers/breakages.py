#!/usr/bin/env python3
"""Breaks the peer on purpose, one way at a time, and checks that gpt_peer.py's same-work check
goes red each time: a check that cannot fail proves nothing.

usage: python3 bench/peers/breakages.py DIR        (DIR as gpt_peer.py takes it, its check passed)
       python3 bench/peers/breakages.py --apply-only

Each breakage edits one line of a copy of bench/peers/ in a temporary directory and runs that
copy's `gpt_peer.py --check-only` on DIR's inputs (linked, so DIR's own results stay as they
are). Breakages that need a layer kind the model lacks (M, E) are left out. Writes
DIR/breakages.txt, a line per breakage with the check's verdict, and exits 1 if any broken peer
passed the check or failed otherwise than by the check's verdict. --apply-only only checks that
every edit still applies to today's source, once, and leaves valid Python (no torch needed).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# (what breaks, the layer kinds it needs, file, the text as it is, the text broken)
BREAKAGES = [
    ("attention without its causal mask", "DE", "gpt_model.py", "is_causal=True)", "is_causal=False)"),
    ("attention scale halved", "DE", "gpt_model.py", "is_causal=True)",
     "is_causal=True, scale=0.5 / math.sqrt(q.shape[-1]))"),
    ("AdamW learning rate x10", "DEM", "gpt_peer.py", "lr=1e-4,", "lr=1e-3,"),
    ("scan input not gated by 1 - a", "M", "gpt_model.py", "linear_scan(a, (1 - a) * u)", "linear_scan(a, u)"),
    ("one capacity slot fewer per expert", "E", "gpt_model.py", "kept = pos < c\n", "kept = pos < c - 1\n"),
    ("router takes the smallest logits", "E", "gpt_model.py", "torch.topk(logits, k, dim=-1)",
     "torch.topk(logits, k, dim=-1, largest=False)"),
]
# What gpt_peer.py reads from DIR.
INPUTS = ("weights.safetensors", "batches.bin", "losses.txt", "gradients_step1.safetensors", "routing_step1.bin")


def broken_copy(into, file, old, new):
    """bench/peers/ copied into `into`, with `old` replaced by `new` in `file`; the edited source."""
    for name in os.listdir(HERE):
        if name.endswith(".py"):
            shutil.copy(os.path.join(HERE, name), into)
    path = os.path.join(into, file)
    text = open(path).read()
    if text.count(old) != 1:
        raise SystemExit(f"breakages: {file} holds {text.count(old)} copies of {old!r}, not one: the peer changed; "
                         f"update BREAKAGES in {__file__} to break the same thing in today's source")
    text = text.replace(old, new)
    open(path, "w").write(text)
    return text


def apply_only():
    with tempfile.TemporaryDirectory() as tmp:
        for what, _, file, old, new in BREAKAGES:
            compile(broken_copy(tmp, file, old, new), file, "exec")
            print(f"applies: {what} ({file})")
    return 0


def layer_pattern(d):
    """The config's layer pattern from the safetensors header alone (gpt_model.load_safetensors
    would read every tensor, gigabytes at h2048)."""
    with open(os.path.join(d, "weights.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]["layer_pattern"]


def last_line(path):
    lines = open(path).read().strip().splitlines() if os.path.exists(path) else []
    return lines[-1] if lines else ""


def main():
    args = sys.argv[1:]
    if args == ["--apply-only"]:
        return apply_only()
    if len(args) != 1:
        raise SystemExit(__doc__)
    d = os.path.abspath(args[0])
    if not last_line(os.path.join(d, "peer_check.txt")).endswith(": yes"):
        raise SystemExit(f"breakages: {d}/peer_check.txt does not say the unbroken peer passed; run "
                         f"bench/peers/gpt_peer.py {args[0]} --check-only first (a red check proves nothing if it is always red)")
    kinds = set(layer_pattern(d))
    lines, bad = [], 0
    for what, needs, file, old, new in BREAKAGES:
        if not kinds & set(needs):
            continue
        with tempfile.TemporaryDirectory() as code, tempfile.TemporaryDirectory() as run:
            broken_copy(code, file, old, new)
            for name in INPUTS:
                if os.path.exists(os.path.join(d, name)):
                    os.symlink(os.path.join(d, name), os.path.join(run, name))
            r = subprocess.run([sys.executable, os.path.join(code, "gpt_peer.py"), run, "--check-only"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            verdict = last_line(os.path.join(run, "peer_check.txt"))
        if r.returncode == 1 and verdict.endswith(": NO"):
            line = f"{what}: red: {verdict}"
        else:  # the whole output to the log; one line of it to breakages.txt
            bad += 1
            print(r.stdout[-4000:], flush=True)
            said = r.stdout.strip().splitlines()
            line = f"{what}: NOT RED (exit {r.returncode}): {verdict or (said[-1] if said else 'no output')}"
        print(line, flush=True)
        lines.append(line)
    with open(os.path.join(d, "breakages.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
