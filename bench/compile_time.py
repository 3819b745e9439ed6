#!/usr/bin/env python3
"""What including capscope costs at compile time: a translation unit with <capscope/capscope.hpp>
and one checked config against an empty one (and one with the header alone, to split the
parsing from the rules' constant evaluation), compiled with g++ and with nvcc (as a .cu file).

usage: python3 bench/compile_time.py [--repeats N] [--csv FILE] [--markdown FILE]

Each compiler compiles each TU N times (default 7), interleaved (empty, config, empty, ...), so
drift hits both alike; the table gives the median wall time and the difference. A compiler that
is not on PATH (nvcc is looked for in /usr/local/cuda/bin too) is reported as missing, not
timed. Exits 1 if a TU fails to compile.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TUTORIAL = os.path.join(ROOT, "examples", "01_first_config", "main.cpp")


def config_tu():
    """Tutorial 01's config, read from its source (so the bench times the config the tutorial
    shows): every rule of the table runs on it in a constant expression."""
    text = open(TUTORIAL).read()
    m = re.search(r"^using moe_training = config<.*?^static_assert\(moe_training::[^\n]*\n", text, re.S | re.M)
    if not m:
        raise SystemExit(f"compile_time: {TUTORIAL} no longer declares `using moe_training = config<...>` followed by a "
                         "static_assert on it: point config_tu() at the config it declares now")
    return "#include <capscope/capscope.hpp>\nusing namespace capscope;\n" + m.group(0) + "int main() { return moe_training::modules.size(); }\n"


INCLUDE_TU = "#include <capscope/capscope.hpp>\nint main() { return 0; }\n"
EMPTY_TU = "int main() { return 0; }\n"
TUS = (("empty", EMPTY_TU), ("capscope.hpp", INCLUDE_TU), ("capscope.hpp + one config", None))


def compilers():
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
    common = ["-std=c++20", "-O2", "-I" + os.path.join(ROOT, "include")]
    return [("g++", ".cpp", [shutil.which("g++")] + common + ["-c"] if shutil.which("g++") else None),
            ("nvcc", ".cu", [nvcc] + common + ["-arch=sm_90", "-c"] if nvcc else None)]


def compile_once(cmd, source, workdir):
    obj = os.path.join(workdir, "out.o")
    t0 = time.perf_counter()
    p = subprocess.run(cmd + [source, "-o", obj], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"compile_time: {' '.join(cmd)} {source} failed:\n{p.stdout[-3000:]}")
    return seconds


def main():
    args = sys.argv[1:]
    repeats, csv_path, md_path = 7, None, None
    while args:
        a = args.pop(0)
        if a in ("--repeats", "--csv", "--markdown") and args:
            v = args.pop(0)
            if a == "--repeats":
                repeats = int(v)
            elif a == "--csv":
                csv_path = v
            else:
                md_path = v
        else:
            raise SystemExit(__doc__)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, ext, cmd in compilers():
            if cmd is None:
                print(f"compile_time: {name} not found: not timed")
                continue
            sources = {}
            for i, (tu, text) in enumerate(TUS):
                sources[tu] = os.path.join(work, f"tu{i}{ext}")
                text = text if text is not None else config_tu()
                with open(sources[tu], "w") as f:
                    f.write(text)
            times = {tu: [] for tu in sources}
            for tu, src in sources.items():  # one unmeasured compile each: the file cache
                compile_once(cmd, src, work)
            for _ in range(repeats):
                for tu, src in sources.items():
                    times[tu].append(compile_once(cmd, src, work))
            empty, header, config = (statistics.median(times[tu]) for tu, _ in TUS)
            rows.append((name, empty, header, config))
            print(f"{name:5s} empty {empty:.3f} s, capscope.hpp {header:.3f} s, capscope.hpp + one config {config:.3f} s "
                  f"(+{config - empty:.3f} s), median of {repeats}")
    if csv_path:
        with open(csv_path, "w") as f:
            f.write("compiler,empty_s,header_s,header_and_config_s,added_s\n")
            for name, empty, header, config in rows:
                f.write(f"{name},{empty:.4f},{header:.4f},{config:.4f},{config - empty:.4f}\n")
    if md_path:
        with open(md_path, "w") as f:
            f.write("| compiler | empty TU (s) | capscope.hpp alone (s) | capscope.hpp + one config (s) | added over empty (s) |\n"
                    "|---|---:|---:|---:|---:|\n")
            for name, empty, header, config in rows:
                f.write(f"| {name} | {empty:.3f} | {header:.3f} | {config:.3f} | {config - empty:.3f} |\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
