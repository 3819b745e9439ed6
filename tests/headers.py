#!/usr/bin/env python3
"""Each public header compiles on its own, included twice (include guards, self-sufficiency)."""
import os, subprocess, sys, tempfile

inc = sys.argv[1]
compiler = sys.argv[sys.argv.index("--") + 1:]
headers = sorted(os.path.relpath(os.path.join(d, f), inc)
                 for d, _, fs in os.walk(os.path.join(inc, "capscope")) for f in fs if f.endswith(".hpp"))
failed = 0
for h in headers:
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as t:
        t.write(f"#include <{h}>\n#include <{h}>\nint main() {{}}\n")
    p = subprocess.run(compiler + ["-I" + inc, t.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.unlink(t.name)
    if p.returncode != 0 or "warning" in p.stdout:
        failed += 1
        print(f"FAIL {h}\n{p.stdout[:3000]}")
print(f"{len(headers) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
