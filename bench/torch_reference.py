#!/usr/bin/env python3
"""PyTorch's CUDA-graph paths on a plain layer stack of the bench's shape, for reference beside
bench/runner_overhead (run in the same gpu-check, on the same machine): bf16, 24 pre-norm
transformer layers, hidden 512, 8 heads, ffn 2048, seq 128, batch 1; forward + backward.

Variants: eager; torch.cuda.make_graphed_callables per layer (PyTorch's per-layer path);
one torch.cuda.graph of the whole forward + backward. Median device ms per step (CUDA events).
Prints a markdown table. Exits 77 without a GPU.
"""
import copy
import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from timing import median_ms  # bench/peers/timing.py

if not torch.cuda.is_available():
    print("no usable CUDA device: skipped")
    sys.exit(77)

H, HEADS, FFN, S, B, L, STEPS = 512, 8, 2048, 128, 1, 24, 100
dev, dt = "cuda", torch.bfloat16


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(H), nn.RMSNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H, bias=False), nn.Linear(H, H, bias=False)
        self.fc1, self.fc2 = nn.Linear(H, FFN, bias=False), nn.Linear(FFN, H, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(self.n1(x)).view(B, S, 3, HEADS, H // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, H)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.n2(x)), approximate="tanh"))


def main():
    torch.manual_seed(0)
    layers = [Layer().to(dev, dt) for _ in range(L)]
    x = torch.randn(B, S, H, device=dev, dtype=dt, requires_grad=True)

    def eager():
        y = x
        for l in layers:
            y = l(y)
        y.float().square().mean().backward()

    results = {"eager": median_ms(eager, steps=STEPS)}

    # make_graphed_callables replaces a module's forward in place: graph copies, keep `layers` eager.
    graphed = [torch.cuda.make_graphed_callables(copy.deepcopy(l), (torch.randn(B, S, H, device=dev, dtype=dt, requires_grad=True),))
               for l in layers]

    def per_layer():
        y = x
        for l in graphed:
            y = l(y)
        y.float().square().mean().backward()

    results["make_graphed_callables per layer"] = median_ms(per_layer, steps=STEPS)

    static_x = torch.randn(B, S, H, device=dev, dtype=dt, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y = static_x
            for l in layers:
                y = l(y)
            y.float().square().mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = static_x
        for l in layers:
            y = l(y)
        y.float().square().mean().backward()
    results["torch.cuda.graph, whole forward + backward"] = median_ms(g.replay, steps=STEPS)

    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: {L} layers, hidden {H}, seq {S}, batch {B}, bf16, "
          f"forward + backward, median of {STEPS} steps\n")
    print("| PyTorch variant | device ms/step (median) |\n|---|---:|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.3f} |")


if __name__ == "__main__":
    main()
