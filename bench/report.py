#!/usr/bin/env python3
"""One report from bench/run_all.sh runs: one CSV of every figure, one Markdown document of the
tables, one plot; and, with --docs, the same tables written into docs/performance.md.

usage: python3 bench/report.py --out DIR [--docs docs/performance.md] RUN...

RUN is the $OUT of a bench/run_all.sh run (several when the parts ran in separate calls): its
machine.txt, compile_time.csv, runner_overhead.csv, inference.csv and peer-*/ directories, each
optional. Writes DIR/results.csv (section, case, variant, metric, value, machine),
DIR/results.md and DIR/results.svg. --docs replaces, in the given file, the text between each
`<!-- report:NAME -->` and `<!-- /report:NAME -->` with the table NAME; a table this run has no
figures for keeps its old text, and the report says which.
"""
import csv
import glob
import os
import re
import sys

from report_plot import step_time_svg  # bench/report_plot.py

TREES_OFF = " (CUDA-graph trees off)"


def read_rows(path):
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []


def machine_of(run):
    path = os.path.join(run, "machine.txt")
    return open(path).read().strip() if os.path.exists(path) else "machine not recorded"


class Figures:
    def __init__(self):
        self.rows = []  # (section, case, variant, metric, value, machine)
        self.checks = {}  # same-model case -> the peer's same-work verdict
        self.trees_off = set()  # (same-model case, PyTorch variant) timed with CUDA-graph trees off
        self.breakages = {}  # same-model case -> bench/peers/breakages.py's lines (the check broken on purpose)

    def add(self, section, case, variant, metric, value, machine):
        for r in self.rows:
            if r[:4] == (section, case, variant, metric):
                raise SystemExit(f"report: {section} / {case} / {variant} / {metric} is in two runs ({r[5]}; {machine}): "
                                 "give each figure once")
        self.rows.append((section, case, variant, metric, float(value), machine))

    def of(self, section):
        return [r for r in self.rows if r[0] == section]

    def value(self, section, case, variant, metric):
        for r in self.rows:
            if r[:4] == (section, case, variant, metric):
                return r[4]
        return None

    def cases(self, section):
        found = list(dict.fromkeys(r[1] for r in self.of(section)))
        return sorted(found, key=model_order) if section == "same model" else found

    def variants(self, section, case=None):
        return list(dict.fromkeys(r[2] for r in self.of(section) if case is None or r[1] == case))

    def machines(self, section, case=None):
        return list(dict.fromkeys(r[5] for r in self.of(section) if case is None or r[1] == case))

    def machine(self, section):
        return "; ".join(self.machines(section))

    def runs_of(self, section, case):
        """'a', 'a, b': the runs (letters, in machines() order) a case's figures come from."""
        every = self.machines(section)
        return ", ".join(chr(ord("a") + every.index(m)) for m in self.machines(section, case))


def collect(runs):
    f = Figures()
    for run in runs:
        if not os.path.isdir(run):
            raise SystemExit(f"report: {run} is not a directory: give the $OUT directories of bench/run_all.sh runs")
        machine = machine_of(run)
        for name in ("runner_overhead.csv", "inference.csv"):
            for r in read_rows(os.path.join(run, name)):
                f.add(r["section"], compact(r["case"]), r["variant"], r["metric"], r["value"], machine)
        for r in read_rows(os.path.join(run, "compile_time.csv")):
            for tu, key in (("empty TU", "empty_s"), ("capscope.hpp alone", "header_s"), ("capscope.hpp + one config", "header_and_config_s")):
                f.add("compile time", r["compiler"], tu, "seconds", r[key], machine)
        for d in sorted(glob.glob(os.path.join(run, "peer-*/")), key=case_order):
            case = case_of(d)
            for r in read_rows(os.path.join(d, "capscope.csv")):
                f.add("same model", case, "capscope " + r["variant"], "step_ms", r["ms"], machine)
            for r in read_rows(os.path.join(d, "peer.csv")):
                name = r["variant"]
                if name.endswith(TREES_OFF):
                    name = name[: -len(TREES_OFF)]
                    f.trees_off.add((case, name))
                f.add("same model", case, "PyTorch " + name, "step_ms", r["ms"], machine)
            if os.path.exists(os.path.join(d, "peer_check.txt")):
                f.checks[case] = open(os.path.join(d, "peer_check.txt")).read().strip().splitlines()[-1]
            if os.path.exists(os.path.join(d, "breakages.txt")):
                f.breakages[case] = open(os.path.join(d, "breakages.txt")).read().strip().splitlines()
    return f


def case_of(d):
    """'h512 s128 b1 L24, mixed' from bench/run_all.sh's directory peer-h512-s128-b1-L24-mixed."""
    parts = os.path.basename(d.rstrip("/")).split("-")[1:]
    return " ".join(parts[:-1]) + ", " + parts[-1]


def case_order(d):
    return model_order(case_of(d))


def model_order(case):
    """'h1024 s512 b2 L24, mixed' sorts by hidden size, then dense before mixed."""
    m = re.match(r"h(\d+)", case)
    return (int(m.group(1)) if m else 0, case)


def compact(case):
    """'dense (DDDD)' -> 'dense (D x 4)': a layer pattern as its repeated unit."""
    def repeat(m):
        p = m.group(1)
        for n in range(1, len(p) // 2 + 1):
            if len(p) % n == 0 and p[:n] * (len(p) // n) == p:
                return f"({p[:n]} x {len(p) // n})"
        return m.group(0)
    return re.sub(r"\(([A-Z]{2,})\)", repeat, case)


def table(head, rows, right_from=1):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < right_from else "---:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def same_model_block(f):
    cases = f.cases("same model")
    if not cases:
        return None
    variants = f.variants("same model")
    machines = f.machines("same model")
    several = len(machines) > 1  # rows from runs on different machines or days: a column says which
    head = ["model"] + variants + ["capscope whole step / PyTorch best"] + (["run"] if several else [])
    rows = []
    for case in cases:
        cells = [case]
        for v in variants:
            ms = f.value("same model", case, v, "step_ms")
            mark = " †" if (case, v.removeprefix("PyTorch ")) in f.trees_off else ""
            cells.append("n/a" if ms is None else f"{ms:.2f}{mark}")
        theirs = [f.value("same model", case, v, "step_ms") for v in variants if v.startswith("PyTorch ")]
        theirs = [t for t in theirs if t is not None]
        ours = f.value("same model", case, "capscope whole-step graph", "step_ms")
        cells.append(f"{ours / min(theirs):.2f}" if theirs and ours else "n/a")
        if several:
            cells.append(f.runs_of("same model", case))
        rows.append(cells)
    if several:
        runs = "".join(f"- run {chr(ord('a') + i)}: {m}\n" for i, m in enumerate(machines))
        text = "Device ms per training step. Each row comes from one run, capscope's and PyTorch's side by side:\n\n" + runs + "\n"
    else:
        text = f"Device ms per training step; {machines[0]}.\n\n"
    text += table(head, rows)
    if f.trees_off:
        text += "\n† with CUDA-graph trees off (`torch._inductor.config.triton.cudagraph_trees = False`): with them on, " \
                "PyTorch 2.11 stopped this model's backward (see below).\n"
    text += "\n" + "".join(f"- {case}: {f.checks.get(case, 'no same-work check in this run')}\n"
                           + "".join(f"  - broken on purpose, {broken(line)}\n" for line in f.breakages.get(case, []))
                           for case in cases)
    return text


def broken(line):
    """A bench/peers/breakages.py line, 'WHAT: red: same work: ... loss difference X ..., ... within Y
    ..., routing choices agreed Z ...: NO', as 'WHAT: red (loss X, gradients Y, routing Z)'."""
    if line.count(": ") < 2:
        return line
    what, verdict, rest = line.split(": ", 2)
    found = [(name, re.search(pattern, rest)) for name, pattern in
             (("loss", r"loss difference (\S+)"), ("gradients", r"gradients within (\S+)"), ("routing", r"agreed (\S+)"))]
    figures = ", ".join(f"{name} {m.group(1)}" for name, m in found if m)
    return f"{what}: **{verdict}** ({figures})" if figures else f"{what}: **{verdict}**: {rest}"


def reference_of(variant):
    """The hand-written code a runner variant is compared with (as bench/runner_overhead.cpp does)."""
    if "full_iteration" in variant or "whole-step" in variant:
        return "hand-written whole-step graph"
    if any(k in variant for k in ("local", "transformer_engine", "per-layer")):
        return "hand-written per-layer graphs"
    return "eager (direct calls)"


def runner_block(f):
    cases = f.cases("runner overhead")
    if not cases:
        return None
    text = f"{f.machine('runner overhead')}.\n"
    head = ["variant", "device ms/step", "host µs/step", "runtime API calls/step", "launches/step", "device vs reference", "host vs reference"]
    for case in cases:
        rows = []
        for v in f.variants("runner overhead", case):
            get = lambda var, m: f.value("runner overhead", case, var, m)
            ref = reference_of(v)
            rows.append([v, f"{get(v, 'device_ms'):.3f}", f"{get(v, 'host_us'):.1f}", f"{get(v, 'runtime_api_calls'):.0f}",
                         f"{get(v, 'launches'):.0f}", f"{get(v, 'device_ms') / get(ref, 'device_ms'):.3f}",
                         f"{get(v, 'host_us') / get(ref, 'host_us'):.3f}"])
        text += f"\n{case[0].upper() + case[1:]}:\n\n" + table(head, rows)
    return text


def exec_update_block(f):
    cases = [c for c in f.cases("exec update") if not c.startswith("through the runner")]
    if not cases:
        return None
    get = lambda c, m, v="": f.value("exec update", c, v, m)
    rows = []
    for c in cases:
        cap, inst, upd = get(c, "capture_us"), get(c, "instantiate_us"), get(c, "update_us")
        rows.append([c, f"{get(c, 'nodes'):.0f}", f"{cap:.1f}", f"{inst:.1f}", f"{upd:.1f}", f"{inst / upd:.1f}x",
                     f"{(cap + inst) / (cap + upd):.2f}x", f"{get(c, 'refused_updates'):.0f}"])
    text = f"{f.machine('exec update')}.\n\n" + table(
        ["graphs", "nodes", "capture (µs)", "instantiate (µs)", "exec update (µs)", "instantiate / update",
         "(capture + instantiate) / (capture + update)", "refused updates"], rows)
    runner = "through the runner, scope block"
    inst, upd = get(runner, "host_us", "reset() + capture_all()"), get(runner, "host_us", "rebind() + capture_all()")
    if inst and upd:
        text += f"\nThrough the runner (scope block): `reset()` + `capture_all()` (capture and instantiate again) {inst:.0f} µs; " \
                f"`rebind()` to the other input slot + `capture_all()` (capture again, update in place) {upd:.0f} µs, {inst / upd:.2f}x.\n"
    return text


def scope_block(f):
    cases = f.cases("inference by scope")
    if not cases:
        return None
    rows = []
    for c in cases:
        e, l, b = (f.value("inference by scope", c, v, "device_us") for v in ("eager", "scope layer", "scope block"))
        rows.append([c.removeprefix("batch "), f"{e:.1f}", f"{l:.1f}", f"{b:.1f}", f"{e / l:.2f}x", f"{e / b:.2f}x"])
    return f"{f.machine('inference by scope')}.\n\n" + table(
        ["batch", "eager (µs)", "scope layer (µs)", "scope block (µs)", "eager / layer", "eager / block"], rows)


def compile_block(f):
    cases = f.cases("compile time")
    if not cases:
        return None
    rows = []
    for c in cases:
        empty, header, config = (f.value("compile time", c, v, "seconds") for v in ("empty TU", "capscope.hpp alone", "capscope.hpp + one config"))
        rows.append([c, f"{empty:.2f}", f"{header:.2f}", f"{config:.2f}", f"{config - empty:.2f}"])
    return f"{f.machine('compile time')} (host compilers; median of the repeats).\n\n" + table(
        ["compiler", "empty TU (s)", "capscope.hpp alone (s)", "capscope.hpp + one config (s)", "added over the empty TU (s)"], rows)


BLOCKS = [("same-model", "The same model in PyTorch", same_model_block), ("runner-overhead", "Runner overhead", runner_block),
          ("exec-update", "Exec update against instantiation", exec_update_block), ("inference-scope", "Inference by scope", scope_block),
          ("compile-time", "Compile time", compile_block)]


def update_docs(path, blocks):
    text = open(path).read()
    for name, body in blocks.items():
        begin, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
        if begin not in text or end not in text:
            raise SystemExit(f"report: {path} has no {begin} ... {end} block: add one where the table belongs")
        if body is None:
            print(f"report: no figures for '{name}' in these runs: its block in {path} keeps its old text")
            continue
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}{end}", text, flags=re.S)
    open(path, "w").write(text)


def main():
    args, out, docs = sys.argv[1:], None, None
    runs = []
    while args:
        a = args.pop(0)
        if a in ("--out", "--docs") and args:
            out, docs = (args.pop(0), docs) if a == "--out" else (out, args.pop(0))
        elif a.startswith("--"):
            raise SystemExit(__doc__)
        else:
            runs.append(a)
    if not out or not runs:
        raise SystemExit(__doc__)
    f = collect(runs)
    if not f.rows:
        raise SystemExit(f"report: no figures in {', '.join(runs)}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["section", "case", "variant", "metric", "value", "machine"])
        w.writerows(f.rows)
    blocks = {name: fn(f) for name, _, fn in BLOCKS}
    md = "# bench/run_all.sh\n\n" + "".join(f"## {title}\n\n{blocks[name]}\n" for name, title, _ in BLOCKS if blocks[name])
    open(os.path.join(out, "results.md"), "w").write(md)
    if f.cases("same model"):
        open(os.path.join(out, "results.svg"), "w").write(step_time_svg(f))
    print(md)
    if docs:
        update_docs(docs, blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
