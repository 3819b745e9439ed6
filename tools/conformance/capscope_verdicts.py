#!/usr/bin/env python3
"""capscope-check's verdict on every conformance case (`capscope-check --json`).

usage: capscope_verdicts.py --capscope-check PATH --cases cases.jsonl --out verdicts.jsonl
"""
import argparse
import concurrent.futures
import gzip
import json
import os
import subprocess


def verdict(tool, case):
    run = subprocess.run([tool, "--json", *case["argv"]], capture_output=True, text=True,
                         env={**os.environ, **case.get("env", {})})
    result = {"id": case["id"], "exit_code": run.returncode}
    try:
        report = json.loads(run.stdout)
    except ValueError:
        report = None
    if report is None:  # a usage error, in argparse's words, before any rule
        result.update(accepted=False, rules=[], refused=[], parse_error=True,
                      message=run.stderr.strip().splitlines()[-1])
        return result
    normalized = report["normalized"] or {}  # null when normalization itself rejected
    result.update(
        accepted=report["valid"],
        impl=normalized.get("impl"),
        modules=normalized.get("modules"),
        inference_scope=normalized.get("inference_scope"),
        inputs=rule_inputs(normalized, report.get("derived", {})),
        rules=[v["rule"] for v in report["violations"]],
        refused=[r["message"] for r in report.get("refused_inputs", [])],  # exit 2, rules beside
        message="; ".join([r["message"] for r in report.get("refused_inputs", [])] +
                          [v["message"] for v in report["violations"]]),
    )
    return result


def rule_inputs(normalized, derived):
    """The rules' inputs after validate_args's rewrites, as megatron_verdicts.py records them."""
    freq = normalized.get("moe_layer_freq")
    recompute = normalized.get("recompute_granularity")
    return {
        "check_for_nan_in_loss_and_grad": normalized.get("check_for_nan_in_loss_and_grad"),
        "num_layers": normalized.get("num_layers"),
        "recompute_granularity": recompute,
        "recompute_modules": sorted(normalized.get("recompute_modules") or [])
        if recompute == "selective" else [],
        "moe_layer_freq": [int(x) for x in freq] if isinstance(freq, list) else freq,
        "pipeline_model_parallel_size": derived.get("pipeline_model_parallel_size"),
        "virtual_pipeline_model_parallel_size": derived.get("virtual_pipeline_model_parallel_size"),
        "params_dtype": derived.get("params_dtype"),
    }


def read_jsonl(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return [json.loads(line) for line in f]


def all_verdicts(tool, cases):
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() * 2) as pool:
        return list(pool.map(lambda c: verdict(tool, c), cases))


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--capscope-check", required=True)
    cli.add_argument("--cases", required=True)
    cli.add_argument("--out", required=True)
    options = cli.parse_args()
    results = all_verdicts(options.capscope_check, read_jsonl(options.cases))
    with open(options.out, "w") as out:
        for result in results:
            out.write(json.dumps(result, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
