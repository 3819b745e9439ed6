#!/usr/bin/env python3
"""Plots bench/offload's CSV: activation memory saved (%) against step time (x no offload), as SVG.

usage: python3 bench/offload_plot.py offload.csv > offload.svg   (standard library only)
"""
import csv, sys

rows = list(csv.DictReader(open(sys.argv[1])))
points = []
for r in rows:
    act_without = float(r["device_mib_without"]) - float(r["state_mib"])
    act_with = float(r["device_mib"]) - float(r["state_mib"])
    saved = 100.0 * (1.0 - act_with / act_without)
    slower = float(r["step_ms"]) / float(r["step_ms_without"])
    points.append((r["variant"], slower, saved, float(r["moved_mib_per_step"])))

W, H, L, B, T, R = 640, 400, 70, 50, 30, 230  # size and margins (right margin holds the legend)
xmax = max(1.1, max(p[1] for p in points) * 1.1)
ymax = max(50.0, max(p[2] for p in points) * 1.2)
x = lambda v: L + (v - 1.0) / (xmax - 1.0) * (W - L - R)
y = lambda v: H - B - v / ymax * (H - B - T)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="Helvetica" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>']
# The goal (issue 33): at least 30% less activation memory at no more than 5% longer steps.
out.append(f'<rect x="{x(1.0):.1f}" y="{y(ymax):.1f}" width="{x(1.05) - x(1.0):.1f}" height="{y(30) - y(ymax):.1f}" fill="#d9f2dd"/>')
out.append(f'<text x="{x(1.0) + 4:.1f}" y="{y(ymax) + 12:.1f}" fill="#2d7a3a">goal</text>')
out.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>')
step = 0.5 if xmax > 2 else 0.05
v = 1.0
while v <= xmax + 1e-9:
    out.append(f'<line x1="{x(v):.1f}" y1="{H - B}" x2="{x(v):.1f}" y2="{H - B + 4}" stroke="black"/><text x="{x(v):.1f}" y="{H - B + 16}" text-anchor="middle">{v:.2f}x</text>')
    v += step
for t in range(0, int(ymax) + 1, 10):
    out.append(f'<line x1="{L - 4}" y1="{y(t):.1f}" x2="{L}" y2="{y(t):.1f}" stroke="black"/><text x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t}%</text>')
out.append(f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">step time, relative to no offload</text>')
out.append(f'<text transform="translate(16,{(T + H - B) / 2:.0f}) rotate(-90)" text-anchor="middle">activation memory saved</text>')
colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
for i, (name, sx, sy, moved) in enumerate(points):
    c = colors[i % len(colors)]
    out.append(f'<circle cx="{x(sx):.1f}" cy="{y(sy):.1f}" r="5" fill="{c}"/>')
    ly = T + 14 + 34 * i
    out.append(f'<circle cx="{W - R + 14}" cy="{ly - 4}" r="5" fill="{c}"/><text x="{W - R + 24}" y="{ly}">{name}</text>')
    out.append(f'<text x="{W - R + 24}" y="{ly + 13}" fill="#555">{sy:.1f}% saved, {sx:.2f}x, {moved / 1024:.1f} GiB/step</text>')
out.append("</svg>")
print("\n".join(out))
