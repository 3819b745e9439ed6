#!/usr/bin/env python3
"""A pipeline step with its sends and receives inside one graph, on two GPUs: runs
tests/mpi/pipeline_p2p_probe.cpp under `mpirun -np 2`; every case must be bitwise equal eager,
replayed and on the CPU. A job still running after --hang-s (120 s) is a hang. Skipped (77)
without mpirun or with fewer than 2 GPUs (scripts/multi-gpu-check.sh runs it on 2).

usage: pipeline_p2p.py PROBE [--hang-s SECONDS] [--ranks N] [-- PROBE ARGS...]
"""
import argparse
import sys

from mpirun_job import ENV, open_mpi_or_skip, run_job, two_gpus_or_skip  # tests/mpi/mpirun_job.py

parser = argparse.ArgumentParser()
parser.add_argument("probe")
parser.add_argument("--hang-s", type=float, default=120.0)
parser.add_argument("--ranks", type=int, default=2, help="processes, one per GPU")
ours, probe_args = (sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]) if "--" in sys.argv else (sys.argv[1:], [])
options = parser.parse_args(ours)
options.probe_args = probe_args
mpirun = open_mpi_or_skip()
two_gpus_or_skip(options.probe, "pipeline_p2p.py", options.ranks)
env = dict(ENV, NCCL_NVLS_ENABLE=ENV.get("NCCL_NVLS_ENABLE", "0"))
code, out = run_job([mpirun, "--allow-run-as-root", "-np", str(options.ranks), "-x", "NCCL_NVLS_ENABLE", options.probe] + options.probe_args, options.hang_s, env)
print(out)
if code is None:
    sys.exit(f"FAIL: still running after {options.hang_s:.0f} s: a hang")
sys.exit(0 if code == 0 and "every case bitwise equal" in out else 1)
