#!/usr/bin/env python3
"""A generated file must equal what its generator prints now (regenerate it when this fails).

usage: output_matches.py FILE -- GENERATOR [ARGS...]
"""
import subprocess, sys

sep = sys.argv.index("--")
path, cmd = sys.argv[1], sys.argv[sep + 1:]
want = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
if open(path).read() != want:
    print(f"{path} is stale; regenerate it with:\n  {' '.join(cmd)} > {path}")
    sys.exit(1)
print(f"{path} is current")
