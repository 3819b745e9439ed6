"""How the PyTorch benchmarks time a step: warm up, then the median of device times between CUDA
events, one pair per step (bench/peers/gpt_peer.py)."""
import statistics

import torch


def median_ms(step, warmup=10, steps=50):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
