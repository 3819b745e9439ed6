#!/usr/bin/env python3
"""Compile-fail check: passes only when the compiler fails AND its first error names the rule.

usage: check.py RULE_ID -- COMPILER ARGS...
       check.py SUCCESS -- COMPILER ARGS...   (the positive twins: must compile, no warnings)
The first line containing "error" must contain "capscope rule RULE_ID:" (for a plan rule P<n>,
"capscope plan rule P<n>:") and the fix, and the whole diagnostic must be at most 15 lines (50 under clang++, which echoes
source lines and explains constraints), so a typo, a missing
include or a different rule firing first all fail the test.
"""
import os
import subprocess
import sys

MAX_LINES = 15  # the whole diagnostic, include chain and instantiation context included
# clang++ echoes each instantiation step's source line with a caret, and explains a failed
# constraint clause by clause: the same diagnostic takes about three times the lines.
MAX_LINES_CLANG = 50

def main():
    sep = sys.argv.index("--")
    rule = sys.argv[1]
    cmd = sys.argv[sep + 1:]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout
    if rule == "SUCCESS":
        if proc.returncode != 0:
            print(f"FAIL: the valid twins did not compile\n$ {' '.join(cmd)}\n{out}")
            return 1
        if "warning" in out:
            print(f"FAIL: the valid twins compiled with warnings\n$ {' '.join(cmd)}\n{out}")
            return 1
        print("ok: every valid twin compiled")
        return 0
    if proc.returncode == 0:
        print(f"FAIL: the snippet for rule {rule} compiled\n$ {' '.join(cmd)}\n{out}")
        return 1
    first_error = next((l for l in out.splitlines() if "error" in l), "")
    # Plan rules (P1, P2, ...) are checked by the plan layer, the others by the rule table.
    is_plan_rule = rule[0] == "P" and rule[1:].isdigit()
    if rule == "SCHEMA":  # a layer schema's own declaration (regions<...>, stage_decl<...>)
        needle = "capscope schema rule:"
    elif rule[0] == "H" and rule[1:].isdigit():  # the hook rules (capscope/hooks/)
        needle = f"capscope hook rule {rule}:"
    else:
        needle = f"capscope plan rule {rule}:" if is_plan_rule else f"capscope rule {rule}:"
    if needle not in first_error:
        print(f"FAIL: first error does not name '{needle}'\nfirst error: {first_error}\n--- full output ---\n{out}")
        return 1
    if "-- fix:" not in first_error:
        print(f"FAIL: the first error does not say the fix\nfirst error: {first_error}")
        return 1
    lines = len(out.splitlines())
    limit = MAX_LINES_CLANG if "clang" in os.path.basename(cmd[0]) else MAX_LINES
    if lines > limit:
        print(f"FAIL: the diagnostic is {lines} lines, more than {limit}\n--- full output ---\n{out}")
        return 1
    print(f"ok: rule {rule} rejected in {lines} lines; first error: {first_error.strip()}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
