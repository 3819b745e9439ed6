#!/usr/bin/env python3
"""Every rule that rejects at compile time (errors and adjustments) has a CASE_ block."""
import re, subprocess, sys

check, cases = sys.argv[1], sys.argv[2]
listed = subprocess.run([check, "--list-rules"], stdout=subprocess.PIPE, text=True, check=True).stdout
rejecting = [l.split()[0] for l in listed.splitlines() if l.split()[1] in ("error", "adjustment")]
have = {m.split("__")[0] for m in re.findall(r"#ifdef CASE_(\w+)", open(cases).read())}
rejecting += ["K1", "K2", "K3"]  # how a config is spelled (capscope/config/spelling.hpp), before the table's rules
missing = [r for r in rejecting if r not in have]
unknown = sorted(have - set(rejecting))
print(f"{len(rejecting)} rejecting rules, {len(missing)} without a compile-fail case, {len(unknown)} cases for no such rule")
for r in missing: print("missing case for", r)
for r in unknown: print("case names no rejecting rule:", r)
sys.exit(1 if missing or unknown else 0)
