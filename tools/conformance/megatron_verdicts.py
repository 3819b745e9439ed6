#!/usr/bin/env python3
"""Megatron-LM's own verdict on every conformance case.

Each case runs as Megatron's unit tests set one up: sys.argv is the command line, then
parse_args() -> validate_args(args) -> core_transformer_config_from_args(args). Megatron is
imported once; every case then runs in its own forked child, so no case sees another's
global state (Megatron keeps args and warnings in module globals) and a case that calls
exit() or crashes ends only its child. Needs torch and a Megatron-LM checkout; the GPU is
only asked for its compute capability, which Megatron's checks read.

usage: megatron_verdicts.py --megatron DIR --cases cases.jsonl --out verdicts.jsonl [--jobs N]
"""
import argparse
import io
import json
import os
import sys
import time
import traceback


def enum_names(values):
    if values is None:
        return None
    if isinstance(values, str):
        return values
    return [getattr(v, "name", str(v)) for v in values]


def answer_device_queries(capability):
    """CUDA cannot start in a forked child, so the child answers Megatron's two device
    queries (GroupedGEMM's compute-capability check, the Blackwell checks) with what the
    real GPU said before forking."""
    import types

    import torch

    major, minor = capability
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        major=major, minor=minor, name="(measured before fork)")


def measure_capability():
    import subprocess

    text = subprocess.run(
        [sys.executable, "-c", "import torch; print(*torch.cuda.get_device_capability())"],
        capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in text.split())


def rule_inputs(args, config):
    """The values the graph rules read after validate_args and TransformerConfig rewrote them
    (the second conformance set compares these too)."""
    freq = config.moe_layer_freq
    return {
        "check_for_nan_in_loss_and_grad": bool(args.check_for_nan_in_loss_and_grad),
        "num_layers": config.num_layers,
        "recompute_granularity": config.recompute_granularity,
        "recompute_modules": (sorted(config.recompute_modules)
                              if config.recompute_granularity == "selective" else []),
        "moe_layer_freq": list(freq) if isinstance(freq, (list, tuple)) else freq,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": config.virtual_pipeline_model_parallel_size,
        "params_dtype": str(config.params_dtype).replace("torch.", ""),
    }


def run_case(case):
    """Runs one case in this (child) process; returns the verdict as a dict."""
    from megatron.training.arguments import (
        core_transformer_config_from_args,
        parse_args,
        validate_args,
    )

    for key, value in case.get("env", {}).items():
        os.environ[key] = value
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    verdict = {"id": case["id"]}
    stage = "parse_args"
    captured = io.StringIO()
    real_stderr = sys.stderr
    try:
        sys.stderr = captured  # argparse writes its usage error here
        args = parse_args()
        sys.stderr = real_stderr
        stage = "validate_args"
        validate_args(args)
        verdict["args"] = {
            "impl": args.cuda_graph_impl,
            "modules": enum_names(args.cuda_graph_modules),
            "inference_scope": getattr(args.inference_cuda_graph_scope, "name", None),
        }
        stage = "core_transformer_config_from_args"
        config = core_transformer_config_from_args(args)
        verdict.update(
            accepted=True,
            impl=config.cuda_graph_impl,
            modules=enum_names(config.cuda_graph_modules),
            inference_scope=getattr(config.inference_cuda_graph_scope, "name", None),
            inputs=rule_inputs(args, config),
        )
    except SystemExit as e:
        sys.stderr = real_stderr
        text = captured.getvalue().strip().splitlines()
        verdict.update(accepted=False, stage=stage, exception="SystemExit",
                       exit_code=e.code if isinstance(e.code, int) else 1,
                       message=text[-1] if text else str(e.code))
    except BaseException as e:  # every other way out is a rejection with a message
        sys.stderr = real_stderr
        frame = traceback.extract_tb(e.__traceback__)[-1]
        verdict.update(accepted=False, stage=stage, exception=type(e).__name__,
                       message=str(e).strip(),
                       raised_at=f"{os.path.relpath(frame.filename)}:{frame.lineno}")
    return verdict


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--megatron", required=True, help="folder that holds megatron/")
    cli.add_argument("--cases", required=True)
    cli.add_argument("--out", required=True)
    cli.add_argument("--jobs", type=int, default=os.cpu_count())
    options = cli.parse_args()

    sys.path.insert(0, os.path.abspath(options.megatron))
    os.chdir(options.megatron)
    os.environ.setdefault("WORLD_SIZE", "8")
    capability = measure_capability()
    started = time.time()
    import megatron.training.arguments  # noqa: F401  (imported once, before forking)
    import megatron.training.argument_utils  # noqa: F401
    import megatron.core.transformer  # noqa: F401
    imported = time.time()

    cases = [json.loads(line) for line in open(options.cases)]
    running = {}
    results = {}

    def reap(block):
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        case, reader = running.pop(pid)
        data = os.read(reader, 1 << 20)
        chunk = data
        while chunk:
            chunk = os.read(reader, 1 << 20)
            data += chunk
        os.close(reader)
        if data:
            results[case["id"]] = json.loads(data)
        else:
            results[case["id"]] = {"id": case["id"], "accepted": False, "stage": "crash",
                                   "exception": "ChildDied", "message": f"status {status}"}
        return True

    for case in cases:
        while len(running) >= options.jobs:
            reap(True)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # Megatron prints and warns freely; keep only the verdict
            os.dup2(devnull, 2)
            try:
                answer_device_queries(capability)
                payload = json.dumps(run_case(case)).encode()
            except BaseException as e:
                payload = json.dumps({"id": case["id"], "accepted": False, "stage": "driver",
                                      "exception": type(e).__name__, "message": str(e)}).encode()
            os.write(writer, payload)  # verdicts stay far below the pipe buffer
            os._exit(0)
        os.close(writer)
        running[pid] = (case, reader)
    while running:
        reap(True)

    with open(options.out, "w") as out:
        for case in cases:
            out.write(json.dumps(results[case["id"]], sort_keys=True) + "\n")
    print(f"megatron_verdicts: device capability {capability}, {len(cases)} cases, import {imported - started:.1f} s, "
          f"cases {time.time() - imported:.1f} s, "
          f"{sum(r['accepted'] for r in results.values())} accepted")


if __name__ == "__main__":
    main()
