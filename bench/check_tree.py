#!/usr/bin/env python3
"""capscope-check on a tree of configs: one run over N generated model_config.yaml files against one
process per file (what a CI job without the multi-input mode does), side by side in one run.
Prints the wall time of each (median of R repeats) and the time per input.

usage: check_tree.py CAPSCOPE_CHECK [--inputs N] [--repeats R] [--markdown FILE]
"""
import argparse, os, random, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("check")
ap.add_argument("--inputs", type=int, default=300)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--markdown")
a = ap.parse_args()
rng = random.Random(20261122)

def config_text():
    lines = ["MODEL_ARGS:", f"  --num-layers: {rng.choice([12, 24, 32])}", f"  --hidden-size: {rng.choice([1024, 2048, 4096])}"]
    impl = rng.choice(["none", "local", "transformer_engine"])
    lines.append(f"  --cuda-graph-impl: {impl}")
    if impl != "none" and rng.random() < 0.7:
        lines.append(f"  --cuda-graph-modules: [{', '.join(rng.sample(['attn', 'mlp', 'moe', 'moe_router', 'mamba'], rng.randint(1, 2)))}]")
    if rng.random() < 0.5:
        lines.append(f"  --num-experts: {rng.choice([8, 64])}")
        if rng.random() < 0.5:
            lines += ["  --moe-expert-capacity-factor: 1.0", "  --moe-pad-expert-input-to-capacity: true"]
    lines.append(f"  --tensor-model-parallel-size: {rng.choice([1, 2, 4])}")
    return "\n".join(lines) + "\n"

with tempfile.TemporaryDirectory() as d:
    paths = []
    for i in range(a.inputs):
        p = os.path.join(d, f"case{i:04d}", "model_config.yaml")
        os.makedirs(os.path.dirname(p))
        with open(p, "w") as f:
            f.write(config_text())
        paths.append(p)

    def one_run():
        t = time.perf_counter()
        p = subprocess.run([a.check, "--from-yaml", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - t
        if p.returncode not in (0, 1) or len(p.stdout.splitlines()) != a.inputs + 1:
            sys.exit(f"check_tree: unexpected output (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return elapsed, p.stdout.splitlines()[-1]

    def per_file():
        t = time.perf_counter()
        for p in paths:
            r = subprocess.run([a.check, "--from-yaml", p], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode not in (0, 1):
                sys.exit(f"check_tree: {p}: exit {r.returncode}")
        return time.perf_counter() - t

    one, many, summary = [], [], ""
    for _ in range(a.repeats):  # interleaved, so drift hits both alike
        e, summary = one_run()
        one.append(e)
        many.append(per_file())
    m1, m2 = statistics.median(one), statistics.median(many)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], stdout=subprocess.PIPE, text=True).stdout.strip()
    table = (f"capscope-check on {a.inputs} generated model_config.yaml files ({summary.split(': ', 1)[1]}); "
             f"{cpu}, {os.cpu_count()} cores; median of {a.repeats} interleaved repeats\n\n"
             "| way | wall s (median) | ms per input | vs one run |\n|---|---:|---:|---:|\n"
             f"| one run, `--from-yaml DIR` | {m1:.3f} | {1000 * m1 / a.inputs:.2f} | 1.00 |\n"
             f"| one process per file | {m2:.3f} | {1000 * m2 / a.inputs:.2f} | {m2 / m1:.1f}x |\n")
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
