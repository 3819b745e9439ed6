#!/usr/bin/env python3
"""Each public header compiles on its own, included twice (include guards, self-sufficiency)."""
import os, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

# usage: headers.py INCLUDE_DIR [--skip PREFIX]... -- COMPILER ARGS...
inc = sys.argv[1]
own = sys.argv[2:sys.argv.index("--")]
skip = [own[i + 1] for i in range(len(own)) if own[i] == "--skip"]
compiler = sys.argv[sys.argv.index("--") + 1:]
headers = sorted(os.path.relpath(os.path.join(d, f), inc)
                 for d, _, fs in os.walk(os.path.join(inc, "capscope")) for f in fs if f.endswith(".hpp"))
skipped = [h for h in headers if any(h.startswith(p) for p in skip)]
headers = [h for h in headers if h not in skipped]
for h in skipped:
    print(f"skipped {h} (its toolkit headers are not available here)")


def compile_alone(h):
    """The compiler's complaint about header h included twice on its own, or None."""
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as t:
        t.write(f"#include <{h}>\n#include <{h}>\nint main() {{}}\n")
    p = subprocess.run(compiler + ["-I" + inc, t.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.unlink(t.name)
    return p.stdout[:3000] if p.returncode != 0 or "warning" in p.stdout else None


failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # each header on its own: side by side
    for h, complaint in zip(headers, pool.map(compile_alone, headers)):
        if complaint is not None:
            failed += 1
            print(f"FAIL {h}\n{complaint}")
print(f"{len(headers) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
