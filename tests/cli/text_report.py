#!/usr/bin/env python3
"""The text report puts the verdict and the violations first: an invalid line shows its rule and
fix within the first lines, and the normalized configuration only with --verbose, after them."""
import subprocess, sys

check = sys.argv[1]
flags = ["--cuda-graph-impl", "local", "--cuda-graph-modules", "moe", "moe_router", "--num-experts", "8"]
failures = []

def run(extra):
    return subprocess.run([check] + extra + flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

plain = run([])
lines = plain.stdout.splitlines()
if plain.returncode != 1:
    failures.append(f"exit {plain.returncode}, expected 1")
if not lines or "INVALID" not in lines[0]:
    failures.append(f"first line is not the verdict: {lines[:1]}")
if "violations:" not in lines[:3] or not any(l.strip().startswith("fix:") for l in lines[:6]):
    failures.append("the violations and their fix are not in the first lines:\n" + "\n".join(lines[:8]))
if any(l.startswith("normalized configuration:") for l in lines):
    failures.append("the normalized configuration is printed without --verbose")
verbose = run(["--verbose"]).stdout.splitlines()
if "normalized configuration:" not in verbose or verbose.index("normalized configuration:") < verbose.index("violations:"):
    failures.append("--verbose does not print the normalized configuration after the violations")
for f in failures:
    print("FAIL:", f)
print(f"{1 - bool(failures)} passed, {int(bool(failures))} failed")
sys.exit(1 if failures else 0)
