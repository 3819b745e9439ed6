#!/usr/bin/env python3
"""capscope-check's inputs beyond a plain command line: @argument files (shell-quoted, any number of arguments per
line, nested, mixable with plain flags) and --from-yaml (a Megatron functional-test MODEL_ARGS mapping). Errors name
the file and the line, and exit 2.

usage: argument_files.py CAPSCOPE_CHECK
"""
import json, os, sys, tempfile

from cli_support import expect, failures, run


with tempfile.TemporaryDirectory() as d:
    def write(name, text):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)

    # @file: several arguments a line, quotes, comments, a nested file, plain flags beside it.
    write("train_args.txt", """# the graph part of a training command line
--cuda-graph-impl transformer_engine   --cuda-graph-modules attn "moe_router"
--num-experts 8 --moe-layer-freq '([0]*3+[1]*9)'   # MoE from layer 3 on
--data-path "/data/my text document" \\
  --use-mcore-models
@more_args.txt
""")
    write("more_args.txt", "--num-layers 12\n")
    rc, out, err = run(["--json", "@train_args.txt", "--no-check-for-nan-in-loss-and-grad"], d)
    expect("@file: a verdict", rc in (0, 1), err)
    if rc in (0, 1):
        j = json.loads(out)
        n = j["normalized"]
        expect("@file: impl", n["impl"] == "transformer_engine", n["impl"])
        expect("@file: quoted module", n["modules"] == ["attn", "moe_router"], n["modules"])
        expect("@file: single-quoted expression", n["moe_layer_freq"] == ["0"] * 3 + ["1"] * 9, n["moe_layer_freq"])
        expect("@file: nested file", n["num_layers"] == 12, n["num_layers"])
        expect("@file: flag after it", n["check_for_nan_in_loss_and_grad"] is False, n["check_for_nan_in_loss_and_grad"])
        expect("@file: quoted value with a space and a line continuation", "--use-mcore-models" in j["ignored"], j["ignored"])
    write("broken.txt", '--num-layers 12\n--cuda-graph-impl "local\n')
    rc, out, err = run(["@broken.txt"], d)
    expect("@file: unterminated quote names file and line", rc == 2 and "broken.txt:2: unterminated double quote" in err, err)
    rc, out, err = run(["@missing.txt"], d)
    expect("@file: a missing file", rc == 2 and "cannot read argument file missing.txt" in err, err)
    write("loop.txt", "@loop.txt\n")
    rc, out, err = run(["@loop.txt"], d)
    expect("@file: a file naming itself", rc == 2 and "nest more than 16 deep" in err, err)

    # --from-yaml: true is a bare flag, false leaves it out, a list is values, (...) one value, ${VAR} as written.
    write("model_config.yaml", """ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
MODEL_ARGS:
  --num-layers: 12
  --cuda-graph-impl: local
  --cuda-graph-modules: [attn, moe_router, moe_preprocess]
  --num-experts: 8
  --moe-layer-freq: ([0]*3+[1]*9)
  --moe-expert-capacity-factor: 1.0
  --moe-pad-expert-input-to-capacity: true
  --bf16: false
  --data-path: ${DATA_PATH}/my_text_document
  --use-mcore-models: true
""")
    rc, out, err = run(["--json", "--from-yaml", "model_config.yaml"], d)
    expect("yaml: a verdict", rc in (0, 1), err)
    if rc in (0, 1):
        j = json.loads(out)
        n = j["normalized"]
        expect("yaml: list", n["modules"] == ["attn", "moe_router", "moe_preprocess"], n["modules"])
        expect("yaml: (...) is one value", n["moe_layer_freq"] == ["0"] * 3 + ["1"] * 9, n["moe_layer_freq"])
        expect("yaml: true is a bare flag", n["moe_pad_expert_input_to_capacity"] is True, n)
        expect("yaml: false leaves the flag out", "--bf16" not in j["ignored"], j["ignored"])
        expect("yaml: ${VAR} stays text", "--data-path" in j["ignored"], j["ignored"])
    rc, out, err = run(["--json", "--from-yaml", "model_config.yaml", "--cuda-graph-impl", "transformer_engine"], d)
    expect("yaml: the command line comes after it (last wins)", rc in (0, 1) and json.loads(out)["normalized"]["impl"] == "transformer_engine", err)
    write("bad.yaml", "MODEL_ARGS:\n  --num-layers: 12\n   --bf16: true\n")
    rc, out, err = run(["--from-yaml", "bad.yaml"], d)
    expect("yaml: a syntax error names file and line", rc == 2 and "bad.yaml:3" in err, err)
    write("no_args.yaml", "ENV_VARS: {}\n")
    rc, out, err = run(["--from-yaml", "no_args.yaml"], d)
    expect("yaml: no MODEL_ARGS", rc == 2 and "no MODEL_ARGS mapping" in err, err)
    write("typo.yaml", "MODEL_ARGS:\n  --num-layers: 12\n  --cuda-graph-imp: local\n")
    rc, out, err = run(["--from-yaml", "typo.yaml"], d)
    expect("yaml: an unknown flag is argparse's error", rc == 2 and "unrecognized arguments: --cuda-graph-imp" in err, err)

print(f"{len(failures) == 0 and 'all' or len(failures)} {'passed' if not failures else 'failed'}")
sys.exit(1 if failures else 0)
