#!/usr/bin/env python3
"""A pipeline step with its sends and receives inside one graph, on two GPUs: runs
tests/mpi/pipeline_p2p_probe.cpp under `mpirun -np 2`; every case must be bitwise equal eager,
replayed and on the CPU. A job still running after --hang-s (120 s) is a hang. Skipped (77)
without mpirun or with fewer than 2 GPUs (scripts/multi-gpu-check.sh runs it on 2).

With --expect-watchdog (and the probe's --stop-rank), a rank stops taking part: the job must end
within --hang-s, failed, with the watchdog's words.

usage: pipeline_p2p.py PROBE [--hang-s SECONDS] [--ranks N] [--expect-watchdog] [-- PROBE ARGS...]
"""
import argparse
import sys

from mpirun_job import ENV, open_mpi_or_skip, run_job, two_gpus_or_skip  # tests/mpi/mpirun_job.py

parser = argparse.ArgumentParser()
parser.add_argument("probe")
parser.add_argument("--hang-s", type=float, default=120.0)
parser.add_argument("--ranks", type=int, default=2, help="processes, one per GPU")
parser.add_argument("--expect-watchdog", action="store_true", help="a rank stops: the watchdog must end every rank")
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
if options.expect_watchdog:
    ended = code != 0 and "capscope watchdog: rank" in out and "did not finish within" in out and "stops taking part" in out
    if any(g in options.probe_args for g in ("one_by_one", "paired")):  # per edge: freed by the world's abort
        ended = ended and "aborted by the world's: leaving, failed" in out
    print("the watchdog ended every rank" if ended else "FAIL: the job did not end through the watchdog")
    sys.exit(0 if ended else 1)
sys.exit(0 if code == 0 and "every case bitwise equal" in out else 1)
