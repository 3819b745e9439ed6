#!/usr/bin/env python3
"""include/capscope/flags/megatron_flag_table.hpp must be what tools/megatron_flags/generate_flag_table.py makes
from the data file beside it (regenerate it when this fails)."""
import os, subprocess, sys, tempfile

generator, data, commit, header = sys.argv[1:5]
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "table.hpp")
    subprocess.run([sys.executable, generator, data, commit, out], check=True)
    if open(out).read() != open(header).read():
        print(f"{header} is stale; regenerate it with:\n  python3 {generator} {data} {commit} {header}")
        sys.exit(1)
print("megatron_flag_table.hpp is current")
