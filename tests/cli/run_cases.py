#!/usr/bin/env python3
"""Runs capscope-check on tests/cli/cases.json and checks exit codes, rule ids and normalized
values. With "-- COMPILER ARGS...", also checks that --emit-cpp compiles iff the configuration is valid
and that a rejected TU names the first violated rule: the two enforcers must agree."""
import argparse, json, os, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    ap.add_argument("--cases", required=True)
    argv = sys.argv[1:]
    compiler = None
    if "--" in argv:  # everything after -- is the compiler command for the emit-cpp check
        compiler = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    a = ap.parse_args(argv)
    a.compiler = compiler
    cases = json.load(open(a.cases))

    def check_case(case):
        """The failures of one case (each case is independent: they run side by side)."""
        failures = []
        name, flags = case["name"], case["flags"]
        def fail(msg):
            failures.append(f"[{name}] {msg}")
        rc, out, err = run([a.check, "--json"] + flags)
        if rc != case["exit"]:
            fail(f"exit {rc}, expected {case['exit']}; stderr: {err.strip()}")
            return failures
        if rc == 2:
            if case.get("stderr", "") not in err:
                fail(f"stderr lacks {case.get('stderr')!r}: {err.strip()}")
            return failures
        verdict = json.loads(out)
        got_v = [v["rule"] for v in verdict["violations"]]
        got_n = [n["rule"] for n in verdict["notes"]]
        if got_v != case.get("violations", []):
            fail(f"violations {got_v}, expected {case.get('violations', [])}")
        if got_n != case.get("notes", []):
            fail(f"notes {got_n}, expected {case.get('notes', [])}")
        for key, want in case.get("normalized", {}).items():
            have = (verdict["normalized"] or {}).get(key, "<missing>")
            if have != want:
                fail(f"normalized {key} = {have!r}, expected {want!r}")
        if a.compiler:
            rc_e, tu, err_e = run([a.check, "--emit-cpp"] + flags)
            if rc_e != rc:
                fail(f"--emit-cpp exit {rc_e} differs from --json exit {rc}")
            # inf and NaN have no fraction{...}: they are emitted as doubles, which clang++ up to 17
            # takes as no template argument (the case says so with "double_arguments": true).
            if case.get("double_arguments") and "clang" in os.path.basename(a.compiler[0]):
                return failures
            with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
                f.write(tu)
            crc, cout, cerr = run(a.compiler + [f.name])
            os.unlink(f.name)
            text = cout + cerr
            if (crc == 0) != (rc == 0):
                fail(f"emitted C++ {'compiled' if crc == 0 else 'did not compile'} but the verdict is "
                     f"{'valid' if rc == 0 else 'invalid'}:\n{tu}\n{text[:2000]}")
            elif rc != 0:
                first = next((l for l in text.splitlines() if "error" in l), "")
                if f"capscope rule {got_v[0]}:" not in first:
                    fail(f"emitted C++ failed, but its first error does not name {got_v[0]}: {first}")
        return failures

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [f for case_failures in pool.map(check_case, cases) for f in case_failures]
    print(f"{len(cases) - len({f.split(']')[0] for f in failures})} passed, {len({f.split(']')[0] for f in failures})} failed")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0

if __name__ == "__main__":
    sys.exit(main())
