#!/usr/bin/env python3
"""Compile-fail check: a case passes only when the compiler fails AND its first error names the rule.

usage: check.py RULE_ID -- COMPILER ARGS...        one case
       check.py SUCCESS -- COMPILER ARGS...        the positive twins: must compile, no warnings
       check.py --cases SOURCE --compiler NAME [--skip-containing TEXT] [--jobs N] -- COMPILER ARGS...
           every case of SOURCE at once: its twins (SOURCE as is), then each `#ifdef CASE_<ID>[__variant]`
           block (SOURCE with -DCASE_<ID>[__variant] -DCAPSCOPE_ONE_CASE, which a file may use to leave its
           valid twins out of a case's compile: they are checked once already), compiled N at a time (default: the CPU count),
           each reported by name as a TAP line ("ok 3 - g++ N2: ..."), so Meson lists every case.
The first line containing "error" must contain "capscope rule RULE_ID:" (for a plan rule P<n>,
"capscope plan rule P<n>:") and the fix, and the whole diagnostic must be at most 15 lines (50 under clang++, which echoes
source lines and explains constraints), so a typo, a missing
include or a different rule firing first all fail the test.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

MAX_LINES = 15  # the whole diagnostic, include chain and instantiation context included
# clang++ echoes each instantiation step's source line with a caret, and explains a failed
# constraint clause by clause: the same diagnostic takes about three times the lines.
MAX_LINES_CLANG = 50


def check(rule, cmd):
    """(passed, message) for one compile of `cmd` against what `rule` expects."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout
    if rule == "SUCCESS":
        if proc.returncode != 0:
            return False, f"FAIL: the valid twins did not compile\n$ {' '.join(cmd)}\n{out}"
        if "warning" in out:
            return False, f"FAIL: the valid twins compiled with warnings\n$ {' '.join(cmd)}\n{out}"
        return True, "ok: every valid twin compiled"
    if proc.returncode == 0:
        return False, f"FAIL: the snippet for rule {rule} compiled\n$ {' '.join(cmd)}\n{out}"
    first_error = next((l for l in out.splitlines() if "error" in l), "")
    # Plan rules (P1, P2, ...) are checked by the plan layer, the others by the rule table.
    is_plan_rule = rule[0] == "P" and rule[1:].isdigit()
    if rule == "SCHEMA":  # a layer schema's own declaration (regions<...>, stage_decl<...>)
        needle = "capscope schema rule:"
    elif rule[0] == "H" and rule[1:].isdigit():  # the hook rules (capscope/hooks/)
        needle = f"capscope hook rule {rule}:"
    elif rule[0] == "C" and rule[1:].isdigit():  # the composition's rules (capscope/compose/)
        needle = f"capscope composition rule {rule}:"
    elif rule[0] == "K" and rule[1:].isdigit():  # how a config is spelled (capscope/config/spelling.hpp)
        needle = f"capscope config rule {rule}:"
    elif rule.startswith("PP") and rule[2:].isdigit():  # a pipeline schedule (capscope/pipeline/)
        needle = f"capscope pipeline rule {rule}:"
    else:
        needle = f"capscope plan rule {rule}:" if is_plan_rule else f"capscope rule {rule}:"
    if needle not in first_error:
        return False, f"FAIL: first error does not name '{needle}'\nfirst error: {first_error}\n--- full output ---\n{out}"
    if "-- fix:" not in first_error:
        return False, f"FAIL: the first error does not say the fix\nfirst error: {first_error}"
    lines = len(out.splitlines())
    limit = MAX_LINES_CLANG if "clang" in os.path.basename(cmd[0]) else MAX_LINES
    if lines > limit:
        return False, f"FAIL: the diagnostic is {lines} lines, more than {limit}\n--- full output ---\n{out}"
    return True, f"ok: rule {rule} rejected in {lines} lines; first error: {first_error.strip()}"


def case_names(source):
    with open(source) as f:
        return [line.split("CASE_", 1)[1].strip() for line in f if line.startswith("#ifdef CASE_")]


def run_cases(argv, cmd):
    options = {"--jobs": str(os.cpu_count() or 1), "--skip-containing": None}
    while argv:
        key, value, argv = argv[0], argv[1], argv[2:]
        options[key] = value
    source, compiler = options["--cases"], options["--compiler"]
    skip = options["--skip-containing"]
    every = case_names(source)
    names = [n for n in every if not (skip and skip in n)]
    skipped = [n for n in every if n not in names]
    jobs = [("twins", "SUCCESS", cmd + [source])] + [(n, n.split("__")[0], cmd + ["-DCAPSCOPE_ONE_CASE", "-DCASE_" + n, source]) for n in names]
    print(f"1..{len(jobs) + len(skipped)}", flush=True)
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, int(options["--jobs"]))) as pool:
        results = pool.map(lambda job: check(job[1], job[2]), jobs)
        for number, ((name, _, _), (passed, message)) in enumerate(zip(jobs, results), start=1):
            head, _, detail = message.partition("\n")
            print(f"{'ok' if passed else 'not ok'} {number} - {compiler} {name}: {head}", flush=True)
            if not passed:
                failed += 1
                for line in detail.splitlines():
                    print("# " + line)
                print(f"{compiler} {name}: {message}", file=sys.stderr)
    for number, name in enumerate(skipped, start=len(jobs) + 1):  # named, not dropped: TAP's SKIP
        print(f"ok {number} - {compiler} {name} # SKIP its headers are not available here ('{skip}' cases need the CUDA toolkit)")
    return 1 if failed else 0


def main():
    sep = sys.argv.index("--")
    cmd = sys.argv[sep + 1:]
    if "--cases" in sys.argv[1:sep]:
        return run_cases(sys.argv[1:sep], cmd)
    passed, message = check(sys.argv[1], cmd)
    print(message)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
