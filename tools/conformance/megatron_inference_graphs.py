#!/usr/bin/env python3
"""Records the CUDA graphs Megatron-LM builds for dynamic-batching inference, for capscope's unit test.

Runs Megatron's own CUDAGraphBatchDimensionBuilder.generate_cuda_graph_batch_dimensions_list (needs
torch and a Megatron-LM checkout on PYTHONPATH, e.g. the GPU machine with `.megatron/`) over a
seeded grid of command-line values. The token budget it is given is clamped first exactly as
DynamicInferenceContext.__init__ clamps it (d98e8a64dd, dynamic_context.py:781-787; that
constructor needs a model, so its three lines are repeated here). One JSON line per case: the
inputs, then "dimensions" ([tokens, prefill, decode], sorted) and "token_counts" (descending), or
"error" (Megatron's assertion).

    PYTHONPATH=.megatron python3 tools/conformance/megatron_inference_graphs.py > tests/unit/megatron_inference_graphs.jsonl
"""
import json
import random
import sys

from megatron.core.inference.batch_dimensions_utils import CUDAGraphBatchDimensionBuilder
from megatron.core.inference.config import CudaGraphSizingDistribution

DEFAULT_MAX_TOKENS = 16384  # DynamicInferenceContext.DEFAULT_MAX_TOKENS


def case(rng):
    tp = rng.choice([1, 1, 2, 4, 8])
    return {
        "tp_size": tp,
        "num_cuda_graphs": rng.choice([-1, 1, 2, 4, 8, 16, 16, 32]),
        "cuda_graph_max_tokens": rng.choice([0, 16, 64, 128, 512, 512, 1024, 4096]),
        "cuda_graph_all_prefills": rng.random() < 0.15,
        "max_requests": tp * rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 96]) if rng.random() < 0.95 else rng.choice([3, 5, 7]),
        "max_tokens": rng.choice([None, None, 256, 1024, 2048, 8192]),
        "max_sequence_length": rng.choice([64, 512, 2560]),
        "num_speculative_tokens": rng.choice([0, 0, 0, 1, 3]),
        "mixed_prefill_count": rng.choice([0, 4, 16, 16]),
        "decode_only": rng.random() < 0.25,
        "sizing": rng.choice(["exponential", "exponential", "linear"]),
    }


def derive(c):
    max_requests, tp = c["max_requests"], c["tp_size"]
    assert max_requests % tp == 0, f"max_requests must be divisible by tp_size ({tp}), but got {max_requests}"
    max_tokens = c["max_tokens"] or DEFAULT_MAX_TOKENS
    decode_bound = max_requests * (c["num_speculative_tokens"] + 1)
    cuda_graph_max_tokens = (max_tokens if c["cuda_graph_all_prefills"]
                             else min(max(c["cuda_graph_max_tokens"], decode_bound), max_tokens))
    dims, counts = CUDAGraphBatchDimensionBuilder.generate_cuda_graph_batch_dimensions_list(
        tp_size=tp, num_cuda_graphs=c["num_cuda_graphs"], cuda_graph_max_tokens=cuda_graph_max_tokens,
        cuda_graph_mixed_prefill_request_count=c["mixed_prefill_count"], max_requests=max_requests, max_tokens=max_tokens,
        max_sequence_length=c["max_sequence_length"], use_cuda_graphs_for_non_decode_steps=not c["decode_only"],
        num_speculative_tokens=c["num_speculative_tokens"], sizing_distribution=CudaGraphSizingDistribution(c["sizing"]))
    return sorted([d.token_count, d.prefill_req_count, d.decode_req_count] for d in dims), counts or []


def main():
    rng = random.Random(20261123)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    errors = 0
    for _ in range(n):
        c = case(rng)
        try:
            c["dimensions"], c["token_counts"] = derive(c)
        except Exception as e:  # noqa: BLE001 (recorded, compared as "rejects")
            c["error"] = f"{type(e).__name__}: {e}"
            errors += 1
        print(json.dumps(c))
    print(f"megatron_inference_graphs: {n} cases, {errors} rejected", file=sys.stderr)


if __name__ == "__main__":
    main()
