#!/usr/bin/env python3
"""Records the CUDA-graph batch sizes Megatron-LM derives, for capscope's unit test.

Runs Megatron's own CUDAGraphBatchDimensionBuilder._calculate_cuda_graph_token_counts (needs
torch and a Megatron-LM checkout on PYTHONPATH, e.g. the GPU machine with `.megatron/`) over a
grid of num_cuda_graphs x max_tokens x tp_size x sizing distribution, and writes one JSON line per
case: {"num_cuda_graphs", "max_tokens", "tp_size", "sizing", "sizes" (ascending) or "error"}.

    PYTHONPATH=.megatron python3 tools/conformance/megatron_batch_sizes.py > tests/unit/megatron_batch_sizes.jsonl
"""
import json
import sys

from megatron.core.inference.batch_dimensions_utils import CUDAGraphBatchDimensionBuilder
from megatron.core.inference.config import CudaGraphSizingDistribution


def main():
    count = 0
    for sizing in ("exponential", "linear"):
        for num in (-1, 1, 2, 3, 4, 5, 8, 16, 32, 64):
            for max_tokens in (1, 2, 3, 7, 8, 50, 64, 100, 128, 333, 512, 1000, 1024, 2048):
                for tp in (1, 2, 4, 8):
                    if max_tokens < tp:
                        continue
                    case = {"num_cuda_graphs": num, "max_tokens": max_tokens, "tp_size": tp, "sizing": sizing}
                    try:
                        sizes = CUDAGraphBatchDimensionBuilder._calculate_cuda_graph_token_counts(
                            tp_size=tp, num_cuda_graphs=num, cuda_graph_max_tokens=max_tokens,
                            sizing_distribution=CudaGraphSizingDistribution(sizing))
                        case["sizes"] = sorted(sizes)
                    except Exception as e:  # noqa: BLE001 (recorded, compared as "rejects")
                        case["error"] = f"{type(e).__name__}: {e}"
                    print(json.dumps(case))
                    count += 1
    print(f"megatron_batch_sizes: {count} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
