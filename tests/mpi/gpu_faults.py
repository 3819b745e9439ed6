#!/usr/bin/env python3
"""A fault on one GPU rank ends both ranks within the bound, naming the rank and what it was doing.

usage: gpu_faults.py PROBE [--only FAULT:IMPL] [--hang-s SECONDS]
Runs PROBE (tests/mpi/gpu_fault_probe.cpp) under `mpirun -np 2` for each fault on rank 1 and each
impl, eager and captured, while rank 0 waits in a collective. The time is taken from the moment
rank 1 prints that it injects the fault to the end of mpirun (start-up, MPI and NCCL set-up are
not the failing rank's doing). A hang is killed at 90 s (--hang-s) and fails. Skipped (77) without
mpirun or with fewer than 2 GPUs. --only runs one case (a broken probe, scripts/multi-gpu-check.sh).
"""
import argparse, os, re, shutil, signal, subprocess, sys, time

BOUND_S = 10.0  # what docs/multi_gpu.md promises for a failing rank
parser = argparse.ArgumentParser()
parser.add_argument("probe")
parser.add_argument("--only", help="FAULT:IMPL, one case")
parser.add_argument("--hang-s", type=float, default=90.0, help="a job still running then is a hang")
options = parser.parse_args()
probe = options.probe
mpirun = shutil.which("mpirun")
if not mpirun:
    print("no mpirun: skipped")
    sys.exit(77)
version = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
if "Open MPI" not in version:  # the flags below are Open MPI's
    print(f"mpirun is not Open MPI ({version.splitlines()[0] if version else '?'}): skipped")
    sys.exit(77)
gpus = subprocess.run([probe, "gpus"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
if gpus.returncode != 0 or not gpus.stdout.strip().isdigit() or int(gpus.stdout) < 2:
    print(f"fewer than 2 usable GPUs ({gpus.stdout.strip() or gpus.returncode}): skipped (scripts/multi-gpu-check.sh runs it on 2)")
    sys.exit(77)

env = dict(os.environ, OMPI_MCA_btl="self,vader", NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
FAILED = "capscope: rank 1 of 2 failed: "
# fault -> what the job's output must hold (every string), by impl where they differ
expected = {
    "none": lambda impl: ["rank 0 of 2: 6 steps exact", "rank 1 of 2: 6 steps exact"],
    "plan": lambda impl: [FAILED + "capscope plan rule P3", "step-level stage 'clip_gradients' has no forward function"],
    "capture": lambda impl: [FAILED + "capscope: capturing graph", "failed in stage 'layer1.mlp'", "cudaStreamSynchronize"],
    "oom": lambda impl: [FAILED + "CUDA error: ", "out of memory",
                         "(in scope 'layer1.mlp')" if impl == "none" else "(in scope 'the trainer, growing a buffer between steps')"],
    "throw": lambda impl: [FAILED + "injected fault: stage 'layer1.mlp' threw at step " + ("5" if impl == "none" else "2, while it was captured")],
    "stop": lambda impl: ["capscope watchdog: rank 0 of 2: step 5 did not finish within 2000 ms", "a rank that stopped taking part"],
}
failed = False
for impl in ["none", "local", "transformer_engine", "full_iteration"]:
    for fault in ["none", "plan", "capture", "oom", "throw", "stop"]:
        if fault == "capture" and impl == "none":
            continue  # nothing is captured
        if options.only and options.only != f"{fault}:{impl}":
            continue
        cmd = [mpirun, "--allow-run-as-root", "-np", "2", "-x", "NCCL_NVLS_ENABLE", probe, fault, impl]
        # Its own process group, so that a hang is killed with every rank it started.
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            out, _ = job.communicate(timeout=options.hang_s)
            rc = job.returncode
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                os.killpg(job.pid, sig)
                try:
                    out, _ = job.communicate(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    out = ""
            rc = None
            print(f"{impl:18} {fault:7}: still running after {options.hang_s:.0f} s, killed: a hang")
        ended = time.time()
        injected = re.search(r"fault injected at ([0-9.]+)", out)
        took = ended - float(injected.group(1)) if injected else None
        missing = [w for w in expected[fault](impl) if w not in out]
        if fault == "none":
            ok = rc == 0 and not missing
            timing = ""
        else:
            ok = rc not in (None, 0) and took is not None and took < BOUND_S and not missing
            timing = f", {took:.1f} s after the fault (bound {BOUND_S:.0f} s)" if took is not None else ", no fault announced"
        print(f"{impl:18} {fault:7}: exit {rc}{timing}: {'ok' if ok else 'WRONG'}")
        for line in out.splitlines():  # the error lines, as the user sees them
            if line.startswith(("capscope", "  fix:", "  this step")) and fault != "none":
                print(f"    {line}")
        if not ok:
            if missing:
                print(f"    missing from the output: {missing}")
            print(out)
            failed = True
sys.exit(1 if failed else 0)
