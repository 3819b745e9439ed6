"""What the MPI fault tests (rank_failure.py, gpu_faults.py) share: Open MPI's mpirun or a skip,
its environment, and a job run with a hang bound that ends every process it started."""
import os
import shutil
import signal
import subprocess
import sys


def open_mpi_or_skip():
    """mpirun's path; exits 77 (skipped) without it, or when it is not Open MPI's."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("no mpirun: skipped")
        sys.exit(77)
    version = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    if "Open MPI" not in version:  # the flags used are Open MPI's
        print(f"mpirun is not Open MPI ({version.splitlines()[0] if version else '?'}): skipped")
        sys.exit(77)
    return mpirun


def two_gpus_or_skip(probe, caller, needed=2):
    """Exits 77 (skipped) unless `probe gpus` counts `needed` usable GPUs or more (2 by default). The probe's own count:
    usable_device_count() is 0 without a driver, so any other failure is one."""
    gpus = subprocess.run([probe, "gpus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if gpus.returncode != 0 or not gpus.stdout.strip().isdigit():
        sys.exit(f"{caller}: '{probe} gpus' failed (exit {gpus.returncode}): {gpus.stdout}{gpus.stderr}")
    if int(gpus.stdout) < needed:
        print(f"{gpus.stdout.strip()} usable GPU(s), {needed} needed: skipped (scripts/multi-gpu-check.sh runs it on {needed})")
        sys.exit(77)


# Shared memory between the ranks of one host; more ranks than slots allowed (CI machines).
ENV = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1")

_running = []  # the job in flight, ended with the test if the test is ended


def _end(job):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            return
        try:
            job.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass


def _on_term(signum, frame):  # meson's or timeout's TERM: take the job's ranks along
    for job in _running:
        _end(job)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _on_term)


def run_job(cmd, hang_s, env=ENV):
    """Runs cmd in its own process group. Returns (exit code or None for a hang, output)."""
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    _running.append(job)
    try:
        out, _ = job.communicate(timeout=hang_s)
        return job.returncode, out
    except subprocess.TimeoutExpired:  # a hang: end mpirun and every rank it started
        _end(job)
        try:
            out, _ = job.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            out = ""
        return None, out
    finally:
        _running.remove(job)
