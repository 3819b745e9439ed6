#!/usr/bin/env python3
"""An error on one MPI rank ends every rank within a bound, naming the rank; no fault, no error.

usage: rank_failure.py PROBE
Runs PROBE under `mpirun -np 2` for each fault (tests/mpi/rank_failure_probe.cpp). Skipped (77)
without mpirun. A hang is killed at 60 s and fails the test.
"""
import os, shutil, signal, subprocess, sys, time

BOUND_S = 10.0  # what docs/multi_gpu.md promises for a failing rank
probe = sys.argv[1]
mpirun = shutil.which("mpirun")
if not mpirun:
    print("no mpirun: skipped")
    sys.exit(77)
version = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
if "Open MPI" not in version:  # the flags below are Open MPI's
    print(f"mpirun is not Open MPI ({version.splitlines()[0] if version else '?'}): skipped")
    sys.exit(77)
env = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1")
cases = [
    ("none", 0, None),
    ("throw", 1, "capscope: rank 1 of 2 failed: injected fault on rank 1, before the all-reduce -- ending every rank (MPI_Abort)"),
    ("scope", 1, "capscope: rank 1 of 2 is ending by an exception; MPI_Abort ends every rank"),
]
failed = False
for fault, want_error, want_text in cases:
    start = time.monotonic()
    # Its own process group, so that a hang is killed with every rank it started.
    job = subprocess.Popen([mpirun, "--allow-run-as-root", "-np", "2", probe, fault], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env, start_new_session=True)
    try:
        out, _ = job.communicate(timeout=60)
        rc = job.returncode
    except subprocess.TimeoutExpired:  # a hang: end mpirun and every rank it started
        os.killpg(job.pid, signal.SIGTERM)
        try:
            out, _ = job.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            try:
                out, _ = job.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                out = ""
        rc = None
    took = time.monotonic() - start
    ok = rc is not None and took < BOUND_S and ((rc == 0) if not want_error else (rc != 0 and want_text in out))
    print(f"fault {fault:6}: exit {rc}, {took:.1f} s (bound {BOUND_S:.0f} s): {'ok' if ok else 'WRONG'}")
    if not ok:
        print(out)
        failed = True
sys.exit(1 if failed else 0)
