#!/usr/bin/env python3
"""Records what Megatron-LM's resolve_tensor_parallel_weight_shards answers, for capscope's unit
test (tests/unit/test_validate_args_inputs.cpp): validate_args calls it first thing with
--tensor-model-parallel-size and --tensor-parallel-num-weight-shards, and again for the expert
layers. Needs torch and a Megatron-LM checkout on PYTHONPATH (the GPU machine with `.megatron/`).
One JSON line per case: {"tp", "shards" (null: not given), "resolved": [shards, factor]} or
{"tp", "shards", "error": "ValueError: ..."}.

    PYTHONPATH=.megatron python3 tools/conformance/megatron_weight_shards.py > tests/unit/megatron_weight_shards.jsonl
"""
import json
import sys

from megatron.core.model_parallel_config import resolve_tensor_parallel_weight_shards


def main():
    count = 0
    for tp in (1, 2, 3, 4, 8):
        for shards in [None, -4, -1, 0] + list(range(1, 17)) + [24, 32, 64]:
            case = {"tp": tp, "shards": shards}
            try:
                case["resolved"] = list(resolve_tensor_parallel_weight_shards(tp, shards, 1))
            except Exception as e:  # noqa: BLE001 (recorded, compared word for word)
                case["error"] = f"{type(e).__name__}: {e}"
            print(json.dumps(case))
            count += 1
    print(f"megatron_weight_shards: {count} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
