#!/usr/bin/env python3
"""capscope-check on many inputs in one run: YAML files, a directory walked for model_config.yaml,
a glob, and --each @file inputs; a file that cannot be read or parsed is that input's usage error
while the others are still checked; one verdict per input and a summary; the worst exit status;
--json as JSON Lines; --format github annotations on the line of the offending key.

usage: many_inputs.py CAPSCOPE_CHECK
"""
import json, os, sys, tempfile

from cli_support import expect, failures, run


with tempfile.TemporaryDirectory() as d:
    def write(name, text):
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    write("tests/moe_bad/model_config.yaml", """ENV_VARS:
  NCCL_ALGO: Ring
MODEL_ARGS:
  --num-layers: 12
  --cuda-graph-impl: local
  --cuda-graph-modules: [moe, moe_router]
  --num-experts: 8
  --moe-expert-capacity-factor: 1.0
  --moe-pad-expert-input-to-capacity: true
""")
    write("tests/dense_ok/model_config.yaml", "MODEL_ARGS:\n  --num-layers: 12\n  --cuda-graph-impl: transformer_engine\n")
    write("tests/deep/er/broken/model_config.yaml", "MODEL_ARGS:\n  --num-layers: [oops\n")
    write("tests/dense_ok/other.yaml", "MODEL_ARGS:\n  --cuda-graph-impl: local\n")  # not model_config.yaml: not walked
    write("a.txt", "--cuda-graph-impl local --cuda-graph-modules attn\n")
    write("b.txt", "--cuda-graph-impl local --cuda-graph-modules full attn\n")

    # A directory: every model_config.yaml below it, sorted; an unreadable one among valid ones.
    rc, out, err = run(["--from-yaml", "tests"], d)
    lines = out.splitlines()
    expect("directory: exit is the worst status (2)", rc == 2, f"{rc} {out} {err}")
    expect("directory: one verdict per model_config.yaml, sorted", len(lines) == 4 and lines[0].startswith("tests/deep/er/broken/model_config.yaml: USAGE ERROR:")
           and lines[1] == "tests/dense_ok/model_config.yaml: VALID" and lines[2].startswith("tests/moe_bad/model_config.yaml: INVALID: [S2]"), out)
    expect("directory: the invalid verdict says the fix", "-- fix:" in lines[2], lines[2] if len(lines) > 2 else out)
    expect("directory: the parse error names file and line", "broken/model_config.yaml:2:" in lines[0] or "broken/model_config.yaml:3:" in lines[0], lines[0] if lines else out)
    expect("directory: summary", lines[-1] == "capscope-check: 3 inputs: 1 valid, 1 invalid, 1 usage error", out)

    # Files and a glob; valid and invalid only: exit 1.
    rc, out, err = run(["--from-yaml", "tests/dense_ok/model_config.yaml", "tests/moe_*/model_config.yaml"], d)
    expect("files and a glob: exit 1 (the worst)", rc == 1, f"{rc} {out}")
    expect("files and a glob: two verdicts and a summary", len(out.splitlines()) == 3 and "2 inputs: 1 valid, 1 invalid, 0 usage errors" in out, out)
    rc, out, err = run(["--from-yaml", "tests/none_*/model_config.yaml", "tests/dense_ok/model_config.yaml"], d)
    expect("a pattern matching nothing is its input's usage error", rc == 2 and "no file matches the pattern tests/none_*/model_config.yaml" in out
           and "tests/dense_ok/model_config.yaml: VALID" in out, out)
    rc, out, err = run(["--from-yaml", "missing.yaml", "tests/dense_ok/model_config.yaml"], d)
    expect("an unreadable file among valid ones", rc == 2 and "missing.yaml: USAGE ERROR: cannot read missing.yaml" in out and ": VALID" in out, out)

    # JSON Lines: one object per input, with its status; the summary goes to stderr.
    rc, out, err = run(["--json", "--from-yaml", "tests"], d)
    objs = [json.loads(l) for l in out.splitlines()]
    expect("--json: one object per input", len(objs) == 3 and [o["status"] for o in objs] == ["usage", "valid", "invalid"], out)
    expect("--json: the invalid object lists its violations", objs and objs[2]["violations"][0]["rule"] == "S2", out)
    expect("--json: summary on stderr", "3 inputs" in err, err)

    # GitHub annotations at the line of the offending key (--cuda-graph-modules is on line 6).
    rc, out, err = run(["--format", "github", "--from-yaml", "tests"], d)
    expect("github: S2 points at the --cuda-graph-modules line",
           "::error file=tests/moe_bad/model_config.yaml,line=6,title=capscope rule S2::cuda_graph_modules must not contain both moe and moe_router -- fix:" in out, out)
    expect("github: the usage error is annotated too", "::error file=tests/deep/er/broken/model_config.yaml,line=" in out, out)
    expect("github: nothing for a valid input", "dense_ok" not in out, out)

    # --each: every @file is its own input; plain flags apply to all.
    rc, out, err = run(["--each", "@a.txt", "@b.txt", "--num-layers", "4"], d)
    expect("--each: one verdict per @file", rc == 1 and out.splitlines()[0] == "a.txt: VALID" and out.splitlines()[1].startswith("b.txt: INVALID: [N5]"), out)
    # Without --each, @files still make one command line (unchanged).
    rc, out, err = run(["@a.txt"], d)
    expect("one @file: the full report as before", rc == 0 and out.startswith("capscope-check: the configuration is VALID"), out)

print(f"{len(failures) == 0 and 1 or 0} passed, {len(failures) and 1 or 0} failed")
sys.exit(1 if failures else 0)
