"""The plot of bench/report.py: for each model of the same-model bench, the step time of every
way to run it, capscope's and PyTorch's, as horizontal bars on a log scale (SVG, standard
library only)."""
import math
import re

CAPSCOPE, PYTORCH = "#1f77b4", "#ff7f0e"


def step_time_svg(f):
    cases = f.cases("same model")
    variants = f.variants("same model")
    bar, gap, label_w, right = 11, 16, 300, 60
    width = 900
    ms = [r[4] for r in f.of("same model")]
    lo, hi = 10 ** math.floor(math.log10(min(ms))), 10 ** math.ceil(math.log10(max(ms)))
    x0, x1 = label_w, width - right
    x = lambda v: x0 + (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (x1 - x0)
    machines = f.machines("same model")
    run = lambda case: "" if len(machines) == 1 else f" (run {f.runs_of('same model', case)})"
    top = 40 + 14 * len(machines)
    height = top + len(cases) * (len(variants) * bar + gap + 18) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="Helvetica" font-size="10">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="13">Training step time, same model, capscope and '
           f'PyTorch side by side in each run (ms, log scale; shorter is faster)</text>']
    for i, m in enumerate(machines):  # the GPU, CUDA, PyTorch and day (the host CPU does not time these)
        label = ("" if len(machines) == 1 else f"run {chr(ord('a') + i)}: ") + re.sub(r", \d+ x [^;]*", "", m)
        out.append(f'<text x="{width / 2:.0f}" y="{34 + 14 * i}" text-anchor="middle" fill="#555">{label}</text>')
    decade = lo
    while decade <= hi:
        for m in (1, 2, 5):
            v = decade * m
            if lo <= v <= hi:
                out.append(f'<line x1="{x(v):.1f}" y1="{top}" x2="{x(v):.1f}" y2="{height - 36}" stroke="#ddd"/>'
                           f'<text x="{x(v):.1f}" y="{height - 24}" text-anchor="middle">{v:g}</text>')
        decade *= 10
    y = top
    for case in cases:
        out.append(f'<text x="4" y="{y + 10}" font-weight="bold">{case}{run(case)}</text>')
        y += 16
        for v in variants:
            value = f.value("same model", case, v, "step_ms")
            color = CAPSCOPE if v.startswith("capscope") else PYTORCH
            name = v + (" †" if (case, v.removeprefix("PyTorch ")) in f.trees_off else "")
            out.append(f'<text x="{label_w - 6}" y="{y + bar - 2}" text-anchor="end">{name}</text>')
            if value is not None:
                out.append(f'<rect x="{x0}" y="{y}" width="{x(value) - x0:.1f}" height="{bar - 2}" fill="{color}"/>'
                           f'<text x="{x(value) + 4:.1f}" y="{y + bar - 2}">{value:.2f}</text>')
            y += bar
        y += gap
    out.append(f'<text x="{width / 2:.0f}" y="{height - 8}" text-anchor="middle">ms per training step '
               f'(† CUDA-graph trees off)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
