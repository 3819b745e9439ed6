#!/usr/bin/env python3
"""Tutorial 14's check: the adopted trainer, under each impl, prints exactly what the original
trainer prints (every step's loss, and the hash of every parameter's bytes after 100 steps).

usage: same_bits.py ORIGINAL ADOPTED     exit 0 if all agree, 1 if not, 77 without a GPU
"""
import re
import subprocess
import sys

RESULT = re.compile(r"^(step \d+ loss |parameter hash )")


def run(*command):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode == 77:
        print(done.stdout.strip())
        sys.exit(77)
    if done.returncode != 0:
        print(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}")
        sys.exit(1)
    return done.stdout


original, adopted = sys.argv[1], sys.argv[2]
want = [l for l in run(original).splitlines() if RESULT.match(l)]
print(f"the original trainer: {want[0]} ... {want[-2]}, {want[-1]}")
same = True
for impl in ("none", "local", "transformer_engine", "full_iteration"):
    out = run(adopted, impl)
    have = [l for l in out.splitlines() if RESULT.match(l)]
    counts = next((l for l in out.splitlines() if l.startswith(impl + ":")), "")
    agree = have == want
    same = same and agree
    print(f"adopted, {impl:<18} {'bitwise equal' if agree else 'DIFFERS'} ({counts})")
    if impl in ("local", "full_iteration") or not agree:  # its plan
        lines = out.splitlines()
        print("\n".join(lines[lines.index(counts) + 1 if counts in lines else 0:]))
print("every impl bitwise equal to the original trainer" if same else "FAIL")
sys.exit(0 if same else 1)
