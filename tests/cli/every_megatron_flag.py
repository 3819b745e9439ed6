#!/usr/bin/env python3
"""Every option string of Megatron's parser (the data file) is accepted by capscope-check with the right arity and
type: a valid value (or none, or N values) gives a verdict (exit 0 or 1), never a usage error (exit 2); a missing
value, a value given to a switch, and a wrong-typed int or float value each give argparse's error (exit 2).

usage: every_megatron_flag.py CAPSCOPE_CHECK FLAGS.jsonl
"""
import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

check, data = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(data) if l.strip()]
SAMPLE = {"int": "1", "float": "0.5", "moe_freq_type": "1", "_parse_cuda_graph_modules_arg": "attn"}


def run(args):
    p = subprocess.run([check] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stderr.strip()


invocations = []  # (args, None) must give a verdict; (args, text) must be argparse's error naming text
for r in rows:
    flag, nargs, typ, choices = r["flag"], r["nargs"], r["type"], r["choices"]
    if r["action"] == "_HelpAction":
        continue  # argparse prints its help and exits: nothing to check
    value = str(choices[0]) if choices else SAMPLE.get(typ, "x")
    if nargs == 0:
        good = [[flag]]
        bad = [([flag + "=1"], "ignored explicit argument")]
    elif nargs in (None, "?"):
        good = [[flag, value], [flag + "=" + value]]
        bad = [([flag], "expected one argument")] if nargs is None else []
    elif nargs in ("+", "*"):
        good = [[flag, value, value]]
        bad = [([flag], "expected at least one argument")] if nargs == "+" else []
    else:
        good = [[flag] + [value] * nargs]
        bad = [([flag] + [value] * (nargs - 1), f"expected {nargs} arguments")]
    if typ in ("int", "float") and not choices:
        wrong = list(good[0])
        wrong[1] = "1.5x"  # the first value, in an otherwise valid invocation
        bad.append((wrong, f"invalid {typ} value: '1.5x'"))
    invocations += [(args, None) for args in good] + bad


def failure(invocation):
    args, want = invocation
    code, err = run(args)
    if want is None:
        return f"{' '.join(args)}: exit 2: {err}" if code == 2 else None
    return None if code == 2 and want in err else f"{' '.join(args)}: expected exit 2 with '{want}', got exit {code}: {err}"


with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # each invocation on its own: side by side
    failures = [f for f in pool.map(failure, invocations) if f]
checked = len(invocations)
for f in failures[:40]:
    print("FAIL", f)
print(f"{len(rows)} option strings, {checked} invocations: {checked - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
