#!/usr/bin/env python3
"""Every bench refuses a bad command line before it asks for a GPU: an unknown option, a missing
value, a malformed or out-of-range number. Each must exit 2, name itself and the option, and print
its usage; none may go on to run or to skip (exit 77), as std::atoi let it.

The options come from each bench's own usage line, so a bench that gains one is covered too.

usage: arguments_refused.py BENCH_EXECUTABLE...
"""
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys


def run(exe, args):
    p = subprocess.run([exe] + args, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def main():
    failures, checked = [], 0
    for exe in sys.argv[1:]:
        name = os.path.basename(exe)
        rc, out, err = run(exe, ["--no-such-option"])
        usage = re.search(r"^usage: " + re.escape(name) + r"( .*)?$", err, re.M)
        if rc != 2 or f"{name}: unknown option '--no-such-option'" not in err or not usage:
            failures.append(f"{name} --no-such-option: exit {rc}, stderr {err!r}")
            continue
        # "[--rounds ROUNDS]", "[--mixed]", a required "--out DIR" without brackets, and a name
        # from a list, "[--only MODE/IMPL]".
        options = re.findall(r"\[?(--[a-z-]+)(?: ([A-Z,_/]+))?\]?", usage.group(1) or "")
        cases = []
        for option, metavar in options:
            if not metavar:
                continue  # a flag takes no value
            cases.append(([option], "needs a value"))
            cases.append(([option, "--no-such-option"], "needs a value"))  # an option where the value should be
            if metavar in ("FILE", "DIR"):
                cases.append(([option, ""], "takes a non-empty value"))
            elif "/" in metavar:
                cases.append(([option, "no-such-name"], "not 'no-such-name'"))
            elif "," in metavar:
                cases.append(([option, "1,x"], "positive numbers"))
                cases.append(([option, "1,-2"], "positive numbers"))
            else:
                cases.append(([option, "x"], "takes an integer"))
                cases.append(([option, "12x"], "takes an integer"))
                cases.append(([option, "-1"], "takes an integer"))
        if not any(metavar not in ("", "FILE", "DIR") and "/" not in metavar for _, metavar in options):
            failures.append(f"{name}: its usage lists no number to check ({usage.group(0)!r})")
        # Each command line on its own: side by side (each run loads cuBLAS).
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda case: run(exe, case[0]), cases))
        for (args, words), (rc, out, err) in zip(cases, results):
            checked += 1
            first = err.splitlines()[0] if err else ""
            ok = rc == 2 and first.startswith(f"{name}: {args[0]} ") and words in first and f"usage: {name}" in err
            print(f"{name} {' '.join(repr(a) if not a or ' ' in a else a for a in args)}: exit {rc}, {first!r}" + ("" if ok else "  <-- FAIL"))
            if not ok:
                failures.append(f"{name} {args}: exit {rc}, stdout {out!r}, stderr {err!r}")
    print(f"{checked} bad command lines over {len(sys.argv) - 1} benches")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
