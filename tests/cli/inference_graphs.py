#!/usr/bin/env python3
"""capscope-check prints the CUDA graphs Megatron-LM would build for dynamic batching: every case
recorded from Megatron itself (tests/unit/megatron_inference_graphs.jsonl, d98e8a64dd) is turned
into the command line that sets its values, checked in one run (--each), and capscope-check's
"inference_graphs" must hold Megatron's token counts and batch dimensions, or Megatron's stop.

usage: inference_graphs.py CAPSCOPE_CHECK RECORDED_JSONL
"""
import json, os, subprocess, sys, tempfile

check, recorded = os.path.abspath(sys.argv[1]), sys.argv[2]
cases = [json.loads(l) for l in open(recorded)]
failures = []

def flags(c):
    f = ["--inference-dynamic-batching", "--cuda-graph-impl", "local",
         "--tensor-model-parallel-size", str(c["tp_size"]),
         "--inference-dynamic-batching-num-cuda-graphs", str(c["num_cuda_graphs"]),
         "--inference-cuda-graph-max-tokens", str(c["cuda_graph_max_tokens"]),
         "--inference-dynamic-batching-max-requests", str(c["max_requests"]),
         "--inference-max-seq-length", str(c["max_sequence_length"]),
         "--num-speculative-tokens", str(c["num_speculative_tokens"]),
         "--inference-dynamic-batching-cuda-graph-mixed-prefill-count", str(c["mixed_prefill_count"]),
         "--inference-dynamic-batching-cuda-graph-sizing-distribution", c["sizing"]]
    if c["max_tokens"] is not None:
        f += ["--inference-dynamic-batching-max-tokens", str(c["max_tokens"])]
    if c["cuda_graph_all_prefills"]:
        f.append("--inference-cuda-graph-all-prefills")
    if c["decode_only"]:
        f.append("--decode-only-cuda-graphs")
    return f

with tempfile.TemporaryDirectory() as d:
    files = []
    for i, c in enumerate(cases):
        path = os.path.join(d, f"case{i:04d}.args")
        with open(path, "w") as fh:
            fh.write(" ".join(flags(c)) + "\n")
        files.append("@" + path)
    p = subprocess.run([check, "--json", "--each"] + files, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [json.loads(l) for l in p.stdout.splitlines()]
    if len(results) != len(cases):
        sys.exit(f"FAIL: {len(results)} results for {len(cases)} cases\n{p.stderr[-2000:]}")
    agree = 0
    for c, r in zip(cases, results):
        g = r.get("inference_graphs")
        if "error" in c:
            ok = g is not None and "megatron_stops" in g
        else:
            ok = (g is not None and "token_counts" in g and g["token_counts"] == c["token_counts"]
                  and sorted(g["batch_dimensions"]) == c["dimensions"])
        agree += ok
        if not ok and len(failures) < 5:
            failures.append(f"{' '.join(flags(c))}\n  Megatron: {c.get('error') or c['token_counts']}\n  capscope-check: {g if g else r}")
    for f in failures:
        print("FAIL:", f)
    print(f"{agree} of {len(cases)} recorded Megatron derivations shown by capscope-check")
    print(f"{int(agree == len(cases))} passed, {int(agree != len(cases))} failed")
    sys.exit(0 if agree == len(cases) else 1)
