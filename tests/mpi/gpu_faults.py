#!/usr/bin/env python3
"""A fault on one GPU rank ends both ranks within the bound, naming the rank and what it was doing.

usage: gpu_faults.py PROBE [--only FAULT:IMPL] [--hang-s SECONDS]
Runs PROBE (tests/mpi/gpu_fault_probe.cpp) under `mpirun -np 2` for each fault on rank 1 and each
impl, eager and captured, while rank 0 waits in a collective. The time is taken from the moment
rank 1 prints that it injects the fault to the end of mpirun (start-up, MPI and NCCL set-up are
not the failing rank's doing). A job still running after --hang-s (90 s) is a hang: it is ended
with its ranks, and no further case runs. Skipped (77) without mpirun or with fewer than 2 GPUs.
--only runs one case (a broken probe, scripts/multi-gpu-check.sh).
"""
import argparse
import re
import sys
import time

from mpirun_job import ENV, open_mpi_or_skip, run_job, two_gpus_or_skip  # tests/mpi/mpirun_job.py

BOUND_S = 10.0  # what docs/multi_gpu.md promises for a failing rank
FAULTS = ["none", "plan", "capture", "oom", "throw", "stop"]
IMPLS = ["none", "local", "transformer_engine", "full_iteration"]
parser = argparse.ArgumentParser()
parser.add_argument("probe")
parser.add_argument("--only", help="FAULT:IMPL, one case")
parser.add_argument("--hang-s", type=float, default=90.0, help="a job still running then is a hang")
options = parser.parse_args()
probe = options.probe
cases = [(f, i) for i in IMPLS for f in FAULTS if not (f == "capture" and i == "none")]  # impl none captures nothing
if options.only:
    cases = [(f, i) for f, i in cases if f"{f}:{i}" == options.only]
    if not cases:
        sys.exit(f"gpu_faults.py: --only {options.only} names no case (FAULT:IMPL, FAULT of {FAULTS}, IMPL of {IMPLS})")
mpirun = open_mpi_or_skip()
two_gpus_or_skip(probe, "gpu_faults.py")

env = dict(ENV, NCCL_NVLS_ENABLE=ENV.get("NCCL_NVLS_ENABLE", "0"))
FAILED = "capscope: rank 1 of 2 failed: "
# fault -> what the job's output must hold (every string), by impl where they differ
expected = {
    "none": lambda impl: ["rank 0 of 2: 6 steps exact", "rank 1 of 2: 6 steps exact"],
    "plan": lambda impl: [FAILED + "capscope plan rule P3", "step-level stage 'clip_gradients' has no forward function"],
    "capture": lambda impl: [FAILED + "capscope: capturing graph", "failed in stage 'layer1.mlp'", "cudaStreamSynchronize"],
    "oom": lambda impl: [FAILED + "CUDA error: ", "out of memory",
                         "(in scope 'layer1.mlp')" if impl == "none" else "(in scope 'the trainer, growing a buffer between steps')"],
    "throw": lambda impl: [FAILED + "injected fault at step " + ("5" if impl == "none" else "2, while capturing")],
    "stop": lambda impl: ["capscope watchdog: rank 0 of 2: step 5 did not finish within 2000 ms", "a rank that stopped taking part"],
}
failed = False
for fault, impl in cases:
    # A breakage on purpose (tests/gpu/breakage.hpp) reaches every rank.
    passed = ["-x", "CAPSCOPE_BREAK"] if "CAPSCOPE_BREAK" in env else []
    cmd = [mpirun, "--allow-run-as-root", "-np", "2", "-x", "NCCL_NVLS_ENABLE", *passed, probe, fault, impl]
    rc, out = run_job(cmd, options.hang_s, env)
    ended = time.time()
    injected = re.search(r"fault injected at ([0-9.]+)", out)
    took = ended - float(injected.group(1)) if injected else None
    missing = [w for w in expected[fault](impl) if w not in out]
    if fault == "none":
        # Under a captured impl, both ranks must have replayed graphs (not fallen back to eager).
        replays = [int(n) for n in re.findall(r"steps exact, (\d+) replays", out)]
        ok = rc == 0 and not missing and len(replays) == 2 and (impl == "none" or min(replays) > 0)
        timing = f", replays {replays}"
    else:
        ok = rc not in (None, 0) and took is not None and took < BOUND_S and not missing
        timing = f", {took:.1f} s after the fault (bound {BOUND_S:.0f} s)" if took is not None else ", no fault announced"
    if rc is None:
        print(f"{impl:18} {fault:7}: still running after {options.hang_s:.0f} s, ended with its ranks: a hang")
    print(f"{impl:18} {fault:7}: exit {rc}{timing}: {'ok' if ok else 'WRONG'}")
    for line in out.splitlines():  # the error as the user sees it, with its continuation lines
        if fault != "none" and line.startswith(("capscope", "  fix:", "  this step", "  nothing of this step", "  the capture")):
            print(f"    {line}")
    if not ok:
        if missing:
            print(f"    missing from the output: {missing}")
        print(out)
        failed = True
    if rc is None:
        break  # a hang: the GPUs may not be free for the next case
sys.exit(1 if failed else 0)
