"""What the capscope-check script tests share: running the tool, and named checks that print
"ok"/"FAIL" and are counted for the exit status."""
import os
import subprocess
import sys

check = os.path.abspath(sys.argv[1])
failures = []


def run(args, cwd):
    p = subprocess.run([check] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def expect(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"))
    if not cond:
        failures.append(name)
