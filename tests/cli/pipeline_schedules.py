#!/usr/bin/env python3
"""capscope-check's pipeline schedule section: the microbatch count from the batch flags and
--world-size, Megatron's refusals of it after start-up (the calculator's, and schedules.py's at
the first step, or at the step a --step-batch-size-schedule reaches a refused size), and every
recorded Megatron schedule (tests/unit/megatron_pipeline_schedules.jsonl) from its command line.

usage: pipeline_schedules.py CAPSCOPE_CHECK RECORDED_JSONL
"""
import json
import subprocess
import sys

BASE = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128", "--max-position-embeddings", "128", "--bf16"]


def check(tool, flags, world=None):
    args = [tool, "--json"] + (["--world-size", str(world)] if world is not None else []) + BASE + flags
    p = subprocess.run(args, capture_output=True, text=True)
    out = json.loads(p.stdout) if p.returncode in (0, 1) else None
    return p.returncode, out, p.stderr


def main():
    tool, recorded = sys.argv[1], sys.argv[2]
    failures = []

    def expect(name, ok, detail):
        if not ok:
            failures.append(f"{name}: {detail}")

    interleaved = ["--num-layers", "16", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2",
                   "--micro-batch-size", "1", "--no-overlap-p2p-communication"]

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "16"], world=8)
    s = j and j.get("pipeline_schedule")
    expect("interleaved, 8 microbatches", rc == 0 and s and s["kind"] == "interleaved 1f1b" and s["data_parallel"] == 2 and
           s["batches"] == [dict(s["batches"][0], global_batch=16, microbatches=8)] and s["batches"][0]["replay_completes"] and
           s["batches"][0]["communicators"] == "shared" and s["batches"][0]["rank0_activation_slots"] == [8, 4], f"rc {rc}, {s} {err}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "12"], world=8)
    refused = j["refused_inputs"] if j else []
    # Twice: at the first training step, and at the first evaluation (the same count by default).
    expect("interleaved, 6 microbatches in groups of 4", rc == 1 and len(refused) == 2 and
           refused[0]["where"] == "schedules.py, at the first training step" and
           refused[1]["where"] == "schedules.py, at the first evaluation (6 microbatches)" and
           "should be 0, or larger than or equal to the pipeline-parallel size, but it is 2" in refused[0]["message"] and
           j["pipeline_schedule"]["batches"][0]["rule"] == "PP4", f"rc {rc}, {refused}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "12", "--microbatch-group-size-per-virtual-pipeline-stage", "6"], world=8)
    expect("the same count in one group of 6", rc == 0 and j["pipeline_schedule"]["group"] == 6, f"rc {rc}, {j and j['refused_inputs']}")

    for zero in ("0", "-3"):
        rc, j, err = check(tool, interleaved + ["--global-batch-size", "16", "--microbatch-group-size-per-virtual-pipeline-stage", zero], world=8)
        refused = j["refused_inputs"] if j else []
        expect(f"a group of {zero} given (Megatron keeps it and refuses it)", rc == 1 and len(refused) == 1 and
               refused[0]["message"] == "The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP=4 , M=8]",
               f"rc {rc}, {refused}")

    steps = interleaved + ["--step-batch-size-schedule", "0:16 1M:20 2M:32"]
    rc, j, err = check(tool, steps, world=8)
    refused = j["refused_inputs"] if j else []
    # The evaluation batch defaults to micro batch x data parallel there: 1 microbatch, refused too.
    expect("a step schedule whose second batch size is refused", rc == 1 and len(refused) == 2 and
           refused[0]["where"] == "schedules.py, at the first step with a global batch of 20" and
           refused[1]["message"] == "The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP=4 , M=1]" and
           [b["microbatches"] for b in j["pipeline_schedule"]["batches"]] == [8, 10, 16], f"rc {rc}, {refused}")
    rc, j, err = check(tool, steps + ["--eval-global-batch-size", "16"], world=8)
    expect("the same with an evaluation batch of 16", rc == 1 and len(j["refused_inputs"]) == 1, f"rc {rc}, {j and j['refused_inputs']}")

    rc, j, err = check(tool, interleaved + ["--step-batch-size-schedule", "0:16 1M:15", "--eval-global-batch-size", "16"], world=8)
    expect("a step schedule's size that is no multiple (asserted when training reaches it)", rc == 1 and any(
        r["message"] == "current global batch size (15) is not divisible by micro_batch_size (1) * data_parallel_size (2)"
        for r in j["refused_inputs"]), f"rc {rc}, {j and j['refused_inputs']}")
    rc, j, err = check(tool, interleaved + ["--step-batch-size-schedule", "0:32 1M:16", "--eval-global-batch-size", "16"], world=8)
    expect("a step schedule whose count falls", rc == 1 and any(
        r["message"] == "Number of microbatches should not decrease; going from 16 to 8" for r in j["refused_inputs"]), f"rc {rc}")
    rc, j, err = check(tool, interleaved + ["--step-batch-size-schedule", "1000:16", "--eval-global-batch-size", "16"], world=8)
    expect("a step schedule without threshold 0 (1,000 tokens are 7 samples of 128)", rc == 1 and any(
        r["message"] == "first schedule entry must have threshold 0, got 7" for r in j["refused_inputs"]), f"rc {rc}")
    rc, j, err = check(tool, interleaved + ["--step-batch-size-schedule", "0:16 100:32", "--eval-global-batch-size", "16"], world=8)
    expect("token thresholds that fall together in samples (--seq-length 128)", rc == 1 and any(
        r["message"] == "schedule thresholds must be strictly increasing, got 0 before 0" for r in j["refused_inputs"]), f"rc {rc}")

    rc, j, err = check(tool, steps + ["--global-batch-size", "16"], world=8)
    expect("a step schedule with a global batch size", rc == 1 and any(
        "Cannot specify both --step-batch-size-schedule and --global-batch-size" in r["message"] for r in j["refused_inputs"]), f"rc {rc}")

    rc, j, err = check(tool, interleaved + ["--step-batch-size-schedule", "0:16 oops"], world=8)
    expect("a malformed step schedule", rc == 1 and any("Invalid schedule entry \"oops\"" in r["message"] for r in j["refused_inputs"]),
           f"rc {rc}, {j and j['refused_inputs']}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "16"], world=10)
    expect("a world size the model does not divide", rc == 1 and any(
        "world size (10) is not divisible by total_model_size (total_model_size=4)" in r["message"] for r in j["refused_inputs"]), f"rc {rc}")

    rc, j, err = check(tool, interleaved + ["--tensor-model-parallel-size", "2147483647", "--context-parallel-size", "2147483647"], world=8)
    expect("a model size past 2^63, the product named with its factor", rc == 1 and any(
        "(total_model_size=tp x pp x cp x the weight-shard factor, past 2^63)" in r["message"] for r in j["refused_inputs"]),
        f"rc {rc}, {j and j['refused_inputs']}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "15"], world=8)
    expect("a global batch that is no multiple of micro batch x data parallel", rc == 1 and any(
        "global batch size (15) is not divisible by micro batch size (1) times data parallel size (2)" in r["message"]
        for r in j["refused_inputs"]), f"rc {rc}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "15", "--decrease-batch-size-if-needed"], world=8)
    # The evaluation batch defaults to the global batch before rounding (15): validate_args refuses it.
    expect("--decrease-batch-size-if-needed rounds down to 7 microbatches", rc == 1 and
           j["pipeline_schedule"]["batches"][0]["microbatches"] == 7 and any(
               r["message"] == "eval_global_batch_size (15) must be divisible by eval_micro_batch_size (1) * data_parallel_size (2) * "
                               "gtp_weight_remat_size (1)" for r in j["refused_inputs"]), f"rc {rc}, {j and j['pipeline_schedule']}")

    # Generalized tensor parallelism (--tensor-parallel-num-weight-shards): the shards' factor over tp
    # counts toward the model size (validate_args), and the calculator is given replicas x factor.
    gtp = interleaved + ["--tensor-model-parallel-size", "2", "--tensor-parallel-num-weight-shards", "4"]
    rc, j, err = check(tool, gtp + ["--global-batch-size", "16"], world=32)
    s = j and j.get("pipeline_schedule")
    expect("GTP factor 2: world 32 over tp 2 x pp 4 x factor 2, 2 replicas, the calculator's data parallel 4", rc == 0 and s and
           s["replicas"] == 2 and s["data_parallel"] == 4 and s["batches"][0]["microbatches"] == 4, f"rc {rc}, {s} {j and j['refused_inputs']}")
    rc, j, err = check(tool, gtp + ["--global-batch-size", "32"], world=32)
    s = j and j.get("pipeline_schedule")
    expect("GTP factor 2 at global batch 32: 8 microbatches, accepted", rc == 0 and s and s["batches"][0]["microbatches"] == 8,
           f"rc {rc}, {s} {j and j['refused_inputs']}")
    rc, j, err = check(tool, gtp + ["--global-batch-size", "32"], world=8)
    expect("GTP: a world the model size with the factor does not divide", rc == 1 and any(
        "world size (8) is not divisible by total_model_size (total_model_size=16)" in r["message"] for r in j["refused_inputs"]), f"rc {rc}")
    rc, j, err = check(tool, gtp, world=32)
    # Megatron's default global batch is micro x replicas (2), while the calculator divides by micro x 4:
    # validate_args's evaluation check refuses it first, in its words.
    expect("GTP without a global batch: the default is refused", rc == 1 and any(
        r["message"] == "eval_global_batch_size (2) must be divisible by eval_micro_batch_size (1) * data_parallel_size (2) * "
                        "gtp_weight_remat_size (2)" for r in j["refused_inputs"]), f"rc {rc}, {j and j['refused_inputs']}")
    for shards, words in (("3", "must be divisible by tensor_model_parallel_size (2)."), ("1", "must be >= tensor_model_parallel_size (2).")):
        rc, j, err = check(tool, interleaved + ["--tensor-model-parallel-size", "2", "--tensor-parallel-num-weight-shards", shards,
                                                "--global-batch-size", "16"], world=16)
        expect(f"weight shards {shards} over tp 2 refused", rc == 1 and any(
            r["where"] == "validate_args" and r["message"] == f"tensor_parallel_num_weight_shards ({shards}) {words}" for r in j["refused_inputs"]),
            f"rc {rc}, {j and j['refused_inputs']}")
    rc, j, err = check(tool, ["--num-layers", "4", "--micro-batch-size", "1", "--tensor-parallel-num-weight-shards", "2", "--fp4-format", "e2m1"])
    expect("GTP with fp4 needs the fp4 parameter gather", rc == 1 and any(
        "requires --fp4-param-gather" in r["message"] for r in j["refused_inputs"]), f"rc {rc}, {j and j['refused_inputs']}")
    rc, j, err = check(tool, ["--num-layers", "4", "--micro-batch-size", "1", "--expert-tensor-parallel-size", "2",
                              "--expert-tensor-parallel-num-weight-shards", "3"])
    expect("expert weight shards refused over the expert tp, in Megatron's (dense) words, the fix naming the expert flags", rc == 1 and any(
        r["message"] == "tensor_parallel_num_weight_shards (3) must be divisible by tensor_model_parallel_size (2)." and
        r["fix"] == "give --expert-tensor-parallel-num-weight-shards as a multiple of --expert-tensor-parallel-size"
        for r in j["refused_inputs"]), f"rc {rc}, {j and j['refused_inputs']}")

    rc, j, err = check(tool, interleaved + ["--global-batch-size", "16"])
    expect("no world size: the count is not known, nothing refused", rc == 0 and "--world-size" in j["pipeline_schedule"]["not_known"] and
           j["pipeline_schedule"]["batches"] == [], f"rc {rc}")

    rc, j, err = check(tool, ["--num-layers", "4", "--micro-batch-size", "1"], world=8)
    expect("no pipeline: no section", rc == 0 and "pipeline_schedule" not in j, f"rc {rc}")

    p = subprocess.run([tool, "--world-size", "0"] + BASE + ["--num-layers", "4"], capture_output=True, text=True)
    expect("--world-size 0 is a usage error", p.returncode == 2, f"rc {p.returncode}")

    text = subprocess.run([tool, "--world-size", "8"] + BASE + interleaved + ["--global-batch-size", "16"], capture_output=True, text=True).stdout
    expect("the text report", "pipeline schedule (as Megatron's schedules.py runs it):" in text and
           "global batch 16: 8 microbatches; bubble in theory 15.8%" in text, text[-600:])

    # Every recorded Megatron schedule, from the command line that runs it (data parallel 1).
    agree = 0
    rows = [json.loads(line) for line in open(recorded)]
    for c in rows:
        ranks, chunks, group, m = c["ranks"], c["chunks"], c["group"], c["microbatches"]
        flags = ["--num-layers", str(ranks * chunks), "--pipeline-model-parallel-size", str(ranks), "--micro-batch-size", "1",
                 "--global-batch-size", str(m)]
        if chunks > 1:
            flags += ["--num-layers-per-virtual-pipeline-stage", "1"]
        if group is not None:
            flags += ["--microbatch-group-size-per-virtual-pipeline-stage", str(group)]
        rc, j, err = check(tool, flags, world=ranks)
        if j is None:
            failures.append(f"recorded {c['ranks'], chunks, group, m}: exit {rc}: {err.strip()}")
            continue
        schedule_refusals = [r for r in j["refused_inputs"] if r["where"] == "schedules.py, at the first training step"]
        if "error" in c:
            words = c["error"].split(": ", 1)[1]
            ok = [r["message"] for r in schedule_refusals] == [words]
        else:
            ok = not schedule_refusals and j["pipeline_schedule"]["batches"][0]["microbatches"] == m
        if ok:
            agree += 1
        else:
            failures.append(f"recorded {ranks, chunks, group, m}: Megatron {c.get('error', 'runs it')}; capscope {schedule_refusals}")
    print(f"recorded Megatron schedules: {agree} of {len(rows)} agree from the command line")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures or agree != len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
