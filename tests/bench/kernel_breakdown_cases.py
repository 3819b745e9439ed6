#!/usr/bin/env python3
"""bench/kernel_breakdown.py on ncu CSVs of both pages (raw, with its units row; details, a row
per metric): kernels summed by category, each side's total, and a clear refusal of a file that
ncu did not write or that holds no kernel.

usage: kernel_breakdown_cases.py SOURCE_ROOT
"""
import os
import sys
import tempfile

import outcome  # tests/bench/outcome.py

root = sys.argv[1]
script = os.path.join(root, "bench", "kernel_breakdown.py")
failed = []

RAW = """==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","usecond"
"0","1234","same_model","h","forward_mma","1","7","(128, 1, 1)","(32, 32, 1)","0","9.0","150.5"
"1","1234","same_model","h","nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","1,200.0"
"2","1234","same_model","h","adamw_k","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","400"
"3","1234","same_model","h","rms_norm_forward_k","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","49.5"
==PROF== Disconnected from process 1234
"""
DETAILS = """"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","9","python3","h","flash_fwd_kernel","1","7","(128, 1, 1)","(16, 32, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","100000"
"1","9","python3","h","triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1","1","7","(512, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","30000"
"2","9","python3","h","multi_tensor_apply_kernel","1","7","(512, 1, 1)","(320, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","0.5"
"""


def run(*args):
    return outcome.run(script, *args)


with tempfile.TemporaryDirectory() as tmp:
    raw, details, empty, bare = (os.path.join(tmp, n) for n in ("raw.csv", "details.csv", "empty.csv", "bare.csv"))
    open(raw, "w").write(RAW)
    open(details, "w").write(DETAILS)
    open(empty, "w").write(RAW.splitlines()[1] + "\n" + RAW.splitlines()[2] + "\n")
    open(bare, "w").write("==PROF== No kernels were profiled.\n")
    md = os.path.join(tmp, "out.md")
    r = run("--out", md, f"capscope={raw}", f"PyTorch={details}")
    text = open(md).read() if os.path.exists(md) else ""
    for want in ("| attention | 150 (1, 8%) | 100 (1, 16%) |", "| GEMM | 1200 (1, 67%) | - |",
                 "| optimizer | 400 (1, 22%) | 500 (1, 79%) |", "| norms | 50 (1, 3%) | 30 (1, 5%) |",
                 "| **all kernels** | **1800** (4) | **630** (3) |"):
        if r.returncode != 0 or want not in text:
            failed.append(f"want the row {want!r}:\n{r.stdout}")
    for path, want in ((empty, "holds no kernel"), (bare, "has no ncu CSV header")):
        r = run(f"capscope={path}")
        if r.returncode == 0 or want not in r.stdout:
            failed.append(f"{os.path.basename(path)} was not refused with {want!r}:\n{r.stdout}")

outcome.finish(failed, "kernel_breakdown.py: both ncu pages summed by category, bad input refused")
