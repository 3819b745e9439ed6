#!/usr/bin/env python3
"""An error on one MPI rank ends every rank within a bound, naming the rank; no fault, no error.

usage: rank_failure.py PROBE
Runs PROBE under `mpirun -np 2` for each fault (tests/mpi/rank_failure_probe.cpp). Skipped (77)
without mpirun. A hang is killed at 60 s and fails the test.
"""
import sys
import time

from mpirun_job import open_mpi_or_skip, run_job  # tests/mpi/mpirun_job.py

BOUND_S = 10.0  # what docs/multi_gpu.md promises for a failing rank
probe = sys.argv[1]
mpirun = open_mpi_or_skip()
cases = [
    ("none", 0, None),
    ("throw", 1, "capscope: rank 1 of 2 failed: injected fault on rank 1, before the all-reduce -- ending every rank (MPI_Abort)"),
    ("scope", 1, "capscope: rank 1 of 2 is ending by an exception; MPI_Abort ends every rank"),
]
failed = False
for fault, want_error, want_text in cases:
    start = time.monotonic()
    rc, out = run_job([mpirun, "--allow-run-as-root", "-np", "2", probe, fault], hang_s=60)
    took = time.monotonic() - start
    ok = rc is not None and took < BOUND_S and ((rc == 0) if not want_error else (rc != 0 and want_text in out))
    print(f"fault {fault:6}: exit {rc}, {took:.1f} s (bound {BOUND_S:.0f} s): {'ok' if ok else 'WRONG'}")
    if not ok:
        print(out)
        failed = True
sys.exit(1 if failed else 0)
