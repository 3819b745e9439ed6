#!/usr/bin/env python3
"""docs/rules.md must equal `capscope-check --list-rules --markdown` (regenerate it when this fails)."""
import subprocess, sys

check, doc = sys.argv[1], sys.argv[2]
want = subprocess.run([check, "--list-rules", "--markdown"], stdout=subprocess.PIPE, text=True, check=True).stdout
have = open(doc).read()
if want != have:
    print(f"{doc} is stale; regenerate it with:\n  {check} --list-rules --markdown > docs/rules.md")
    sys.exit(1)
print("docs/rules.md is current")
