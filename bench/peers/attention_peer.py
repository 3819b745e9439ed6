"""PyTorch's scaled_dot_product_attention on the shape bench/attention times: causal, bf16, the
forward and the backward of one layer, with the cuDNN and the FlashAttention-2 backends (each
where this PyTorch has it). Prints lines in bench/attention's format.

    python3 bench/peers/attention_peer.py [--batch B] [--seq S] [--heads N] [--head-dim D]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_us(call, per_round=20, rounds=15):
    """Device µs per call: `per_round` calls enqueued back to back between two events, divided
    (so the GPU, not Python's dispatch, sets the pace), the median of `rounds`."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_round):
            call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / per_round)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=64)
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(5)
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    forward_flop = 2.0 * 2.0 * a.batch * a.heads * a.seq * a.seq * a.head_dim / 2.0
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                fwd = median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                bwd = median_us(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        except RuntimeError as e:
            print(f"torch {name}: not available here ({str(e).splitlines()[0]})")
            continue
        for what, us, flop in (("forward", fwd, forward_flop), ("backward", bwd, 2.5 * forward_flop)):
            print(f"torch {name:<6} {what:<9} {us:8.1f} us  {flop / (us * 1e-6) / 1e12:6.1f} TFLOP/s useful")


if __name__ == "__main__":
    main()
