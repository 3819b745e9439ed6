#!/usr/bin/env python3
"""capscope-check on inputs that once crashed it, stopped a whole tree, or passed unchecked: each
must give a verdict or a usage error that says what was wrong, and the other inputs of a run are
still checked. (Found by probing the tool with malformed input; each case failed before its fix.)

usage: bad_inputs.py CAPSCOPE_CHECK
"""
import json, os, shutil, subprocess, sys, tempfile

from cli_support import check, expect, failures, run

OK = "MODEL_ARGS:\n  --num-layers: 12\n  --cuda-graph-impl: transformer_engine\n"
S2 = "MODEL_ARGS:\n  --num-layers: 4\n  --cuda-graph-impl: local\n  --cuda-graph-modules: [moe, moe_router]\n  --num-experts: 8\n"

with tempfile.TemporaryDirectory() as d:
    def write(name, text, mode="w"):
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, mode) as f:
            f.write(text)
        return path

    # A key that is a list (yaml-cpp threw from as<std::string>, uncaught): that input's usage
    # error, and the rest of the tree is still checked.
    write("t/a/model_config.yaml", OK)
    write("t/b/model_config.yaml", "MODEL_ARGS:\n  ? [a, b]\n  : 1\n")
    rc, out, err = run(["--from-yaml", "t"], d)
    expect("a list as a key: a usage error naming file and line, the other file checked",
           rc == 2 and "t/b/model_config.yaml: USAGE ERROR: t/b/model_config.yaml:2: a MODEL_ARGS key is a list, not a --flag name" in out
           and "t/a/model_config.yaml: VALID" in out and "2 inputs: 1 valid, 0 invalid, 1 usage error" in out, f"{rc} {out} {err}")

    # GitHub annotations with a key of dashes alone, or one that is no regular expression.
    for key in ["--", "--foo("]:
        path = write(f"keys{len(key)}/model_config.yaml", S2 + f"  {key}: ~\n")
        rc, out, err = run(["--format", "github", "--from-yaml", path], d)
        expect(f"github annotations with a key '{key}'", rc == 1 and "title=capscope rule S2::" in out and "line=4" in out, f"{rc} {out} {err}")

    # A bad value in a YAML file: the annotation points at its key (it pointed at line 1).
    path = write("badvalue/model_config.yaml", "MODEL_ARGS:\n  --num-layers: 4\n  --num-experts: abc\n")
    rc, out, err = run(["--format", "github", "--from-yaml", path], d)
    expect("github: a bad value's usage error is annotated at its key", rc == 2 and ",line=3,title=capscope-check%3A usage error::" in out
           and "--num-experts: invalid int value: 'abc'" in out, f"{rc} {out} {err}")

    rc, out, err = run(["--format", "github", "--num-layers", "4"], d)
    expect("--format github without inputs: says so, not that --each found none", rc == 2 and "--format github checks --from-yaml files" in err
           and "--each" in err and "--each found" not in err, f"{rc} {out} {err}")

    # Bytes that are not UTF-8 under --json (nlohmann::json threw from dump).
    rc, out, err = run(["--json", "--cuda-graph-impl", "local", "--cuda-graph-modules", "attn\udcff"], d)
    try:
        obj = json.loads(out)
    except ValueError:
        obj = None
    expect("--json with a name that is not UTF-8: JSON, the byte replaced", rc == 1 and obj is not None and "\ufffd" in out, f"{rc} {out!r} {err}")
    write("latin1/model_config.yaml", b"MODEL_ARGS:\n  --cuda-graph-modules: [caf\xe9]\n  --cuda-graph-impl: local\n", "wb")
    rc, out, err = run(["--json", "--from-yaml", "latin1/model_config.yaml", "t/a/model_config.yaml"], d)
    lines = out.splitlines()
    expect("--json over two files, one of them Latin-1: one JSON object each", rc == 1 and len(lines) == 2 and all(json.loads(l) for l in lines),
           f"{rc} {out!r} {err}")

    # --moe-layer-freq: deep brackets (a stack overflow), and products that wrapped around.
    deep = "(" * 30000 + "[1]" + ")" * 30000
    rc, out, err = run(["--moe-layer-freq", deep, "--num-experts", "8", "--num-layers", "1"], d)
    expect("--moe-layer-freq nested 30000 deep: refused", rc == 2 and "brackets nested deeper than 256" in err, f"{rc} {err[:300]}")
    rc, out, err = run(["--moe-layer-freq", "(" * 200 + "[1]" + ")" * 200, "--num-experts", "8", "--num-layers", "1"], d)
    expect("--moe-layer-freq nested 200 deep: read", rc in (0, 1) and "nested" not in err, f"{rc} {err[:300]}")
    for pattern, why in [("536870912*536870912*16*[1,1,1,1]", "number too large"), ("4294967296*[1]", "number too large"),
                         ("999999999*[1,1,1,1]", "pattern too long"), ("[1]*999999999", "pattern too long")]:
        rc, out, err = run(["--moe-layer-freq", pattern, "--num-experts", "8", "--num-layers", "4"], d)
        expect(f"--moe-layer-freq {pattern}: refused ({why})", rc == 2 and why in err, f"{rc} {err[:300]}")

    # Integers capscope keeps in an int: past its range a usage error, never a wrapped value.
    rc, out, err = run(["--mtp-num-layers", "4294967296", "--num-layers", "4"], d)
    expect("--mtp-num-layers 2^32: out of range, not read as 0", rc == 2 and "--mtp-num-layers: invalid int (out of range) value: '4294967296'" in err,
           f"{rc} {out} {err}")
    rc, out, err = run(["--num-virtual-stages-per-pipeline-rank", "2147483648", "--pipeline-model-parallel-size", "2", "--num-layers", "4"], d)
    expect("--num-virtual-stages-per-pipeline-rank 2^31: out of range, not negative", rc == 2 and "out of range" in err, f"{rc} {out} {err}")
    rc, out, err = run(["--cpu-offloading-num-layers", "2000000000"], d)
    expect("--cpu-offloading-num-layers without --num-layers: no comparison with a missing count", rc in (0, 1) and "less than" not in out,
           f"{rc} {out} {err}")

    # A directory named as an argument file read as empty (and passed); a NUL byte in one.
    os.makedirs(os.path.join(d, "argdir"))
    rc, out, err = run(["@argdir"], d)
    expect("a directory as @file: a usage error", rc == 2 and "argdir is a directory, not an argument file" in err, f"{rc} {out} {err}")
    rc, out, err = run(["--each", "@argdir"], d)
    expect("a directory as --each @file: a usage error", rc == 2 and "is a directory" in out, f"{rc} {out} {err}")
    write("nul.args", b"--num-layers 4\n--cuda-graph-impl\0 local\n", "wb")
    rc, out, err = run(["@nul.args"], d)
    expect("a NUL byte in an argument file: named with its line", rc == 2 and "nul.args:2: a NUL byte" in err, f"{rc} {out} {err}")

    # A second YAML document went unchecked; an empty one (a trailing ---) holds nothing.
    write("multi/model_config.yaml", OK + "---\nMODEL_ARGS:\n  --bogus: 1\n")
    rc, out, err = run(["--from-yaml", "multi/model_config.yaml"], d)
    expect("a second YAML document: refused with its line", rc == 2 and "model_config.yaml:5: a second YAML document" in err, f"{rc} {out} {err}")
    write("trailing/model_config.yaml", OK + "---\n")
    rc, out, err = run(["--from-yaml", "trailing/model_config.yaml"], d)
    expect("a trailing '---': still one config", rc == 0, f"{rc} {out} {err}")
    for name, text in [("empty", ""), ("scalar", "just text\n"), ("list", "- a\n- b\n")]:
        write(f"{name}/model_config.yaml", text)
        rc, out, err = run(["--from-yaml", f"{name}/model_config.yaml"], d)
        expect(f"a YAML file that is {name}: no MODEL_ARGS mapping", rc == 2 and "no MODEL_ARGS mapping at the top level" in err, f"{rc} {out} {err}")

    # Empty names: an empty module name is a module Megatron does not have (it was read as none).
    for flags, rule in [(["--cuda-graph-impl", "local", "--cuda-graph-modules", ""], "N6"),
                        (["--recompute-granularity", "selective", "--recompute-modules", ""], "R0"),
                        (["--fine-grained-activation-offloading", "--offload-modules", ""], "O2"),
                        (["--vision-cuda-graph-impl", ""], "V1"),
                        (["--vision-cuda-graph-impl", "transformer_engine", "--vision-cuda-graph-scope", ""], "V2")]:
        rc, out, err = run(flags + ["--json"], d)
        rules = [v["rule"] for v in json.loads(out)["violations"]] if rc == 1 else []
        expect(f"{' '.join(repr(f) if not f else f for f in flags)}: rule {rule}, naming the empty name", rule in rules and "(empty name)" in out,
               f"{rc} {out} {err}")

    # --emit-cpp: the command line goes into a comment, whatever it holds.
    rc, out, err = run(["--emit-cpp", "--num-layers", "4", "--data-path", 'x\nstatic_assert(false, "injected");', "--tokenizer-model", "a\\"], d)
    head = out.split("#include", 1)[0].splitlines()
    expect("--emit-cpp: every header line is a comment, none ends in a backslash",
           rc == 0 and head and all(l.startswith("//") and not l.endswith("\\") for l in head) and "\\x0a" in out, out[:600])
    gxx = shutil.which("g++")
    if not gxx:
        print("note: no g++ on PATH: the emitted file is not compiled here")
    include = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
    if gxx and rc == 0:
        src = write("emitted.cpp", out)
        p = subprocess.run([gxx, "-std=c++20", "-fsyntax-only", "-I" + include, src], capture_output=True, text=True)
        expect("--emit-cpp: the file compiles", p.returncode == 0, p.stderr[:600])
    # A NaN dropout is a value Megatron's parser takes, and the verdict is valid: the emitted file
    # must compile too (its self-comparison failed: NaN is unequal to itself).
    rc, out, err = run(["--emit-cpp", "--attention-dropout", "nan"], d)
    if gxx and rc == 0:
        src = write("emitted_nan.cpp", out)
        p = subprocess.run([gxx, "-std=c++20", "-fsyntax-only", "-I" + include, src], capture_output=True, text=True)
        expect("--emit-cpp --attention-dropout nan: valid, and the file compiles", p.returncode == 0, p.stderr[:600])
    else:
        expect("--emit-cpp --attention-dropout nan: valid", rc == 0, f"{rc} {err}")

    # Links in a tree: a model_config.yaml that is a link to nothing is named, never skipped;
    # links to directories are not followed (as find does: they may lead out of the tree or
    # back into it), so a config is reported under its real path, once.
    write("links/real/model_config.yaml", OK)
    os.symlink("real", os.path.join(d, "links", "alias"))
    os.makedirs(os.path.join(d, "elsewhere", "x"))
    write("elsewhere/x/model_config.yaml", S2)
    os.symlink(os.path.join(d, "elsewhere"), os.path.join(d, "links", "outside"))
    os.makedirs(os.path.join(d, "links", "gone"))
    os.symlink("/nonexistent/model_config.yaml", os.path.join(d, "links", "gone", "model_config.yaml"))
    os.symlink("/nonexistent/dir", os.path.join(d, "links", "nowhere"))
    os.symlink("loop_b", os.path.join(d, "links", "loop_a"))
    os.symlink("loop_a", os.path.join(d, "links", "loop_b"))
    os.symlink("..", os.path.join(d, "links", "real", "up"))
    rc, out, err = run(["--from-yaml", "links"], d)
    expect("a tree with links: the config under its real path, once", "links/real/model_config.yaml: VALID" in out and out.count(": VALID") == 1, out)
    expect("a tree with links: a link to nothing named model_config.yaml is a usage error",
           "links/gone/model_config.yaml: USAGE ERROR: cannot read links/gone/model_config.yaml" in out, out)
    expect("a tree with links: directory links are not followed, other links are not inputs",
           rc == 2 and "capscope-check: 2 inputs: 1 valid, 0 invalid, 1 usage error" in out and "outside" not in out, out)

    # Python-style ints in the inference derivation (std::stoi read '1_000' as 1), and one past
    # the int range (an uncaught std::out_of_range aborted, ending a whole --json tree too).
    inference = ["--inference-dynamic-batching", "--cuda-graph-impl", "local", "--inference-dynamic-batching-max-requests"]
    rc1, out1, err1 = run(["--json"] + inference + ["1_000"], d)
    rc2, out2, err2 = run(["--json"] + inference + ["1000"], d)
    graphs1 = json.loads(out1).get("inference_graphs") if rc1 in (0, 1) else None
    graphs2 = json.loads(out2).get("inference_graphs") if rc2 in (0, 1) else None
    expect("--inference-dynamic-batching-max-requests 1_000 derives the graphs of 1000", rc1 == rc2 and graphs1 == graphs2 and
           graphs1 is not None and "not_known" not in json.dumps(graphs1), f"{rc1} {graphs1} {graphs2} {err1}")
    rc, out, err = run(inference + ["99999999999"], d)
    expect("an int past 2^31 - 1 in the inference derivation: a verdict, the graphs not derived, saying why",
           rc in (0, 1) and "not derived: --inference-dynamic-batching-max-requests 99999999999 is past the int range" in out, f"{rc} {out} {err}")
    rc, out, err = run(["--tensor-model-parallel-size", "99999999999"] + inference + ["64"], d)
    expect("--tensor-model-parallel-size past the int range with the inference derivation: no abort", rc in (0, 1, 2), f"{rc} {out} {err}")
    write("big/model_config.yaml", "MODEL_ARGS:\n  --inference-dynamic-batching: true\n  --cuda-graph-impl: local\n"
          "  --inference-dynamic-batching-max-requests: 99999999999\n")
    rc, out, err = run(["--json", "--from-yaml", "big/model_config.yaml", "t/a/model_config.yaml"], d)
    expect("--json over a tree with such a file: every input still checked", len(out.splitlines()) == 2, f"{rc} {out} {err}")

    # A negative layer count: Megatron's TransformerConfig fails on it as on 0 (math.sqrt of a
    # negative number), so it is refused before the graph rules, not passed.
    rc, out, err = run(["--num-layers", "-1"], d)
    expect("--num-layers -1: refused as Megatron's TransformerConfig refuses it", rc == 1 and "math domain error" in out, f"{rc} {out} {err}")
    # YAML 1.1's booleans, as Python's yaml reads them: TRUE and on are the flag given, OFF not given.
    write("bools/model_config.yaml", "MODEL_ARGS:\n  --num-layers: 4\n  --cuda-graph-impl: local\n  --inference-dynamic-batching: TRUE\n"
          "  --inference-dynamic-batching-max-requests: 64\n  --decode-only-cuda-graphs: OFF\n")
    rc, out, err = run(["--json", "--from-yaml", "bools/model_config.yaml"], d)
    expect("YAML TRUE and OFF are booleans (Python's yaml), not text", rc in (0, 1) and '"inference_graphs"' in out, f"{rc} {out[:300]} {err}")

    write("deep/model_config.yaml", "MODEL_ARGS:\n  --num-layers: " + "[" * 5000 + "]" * 5000 + "\n")
    rc, out, err = run(["--from-yaml", "deep/model_config.yaml"], d)
    expect("YAML nested 5000 deep: named as too deep, not 'bad file'", rc == 2 and "YAML nested deeper than the reader takes" in (out + err)
           and "bad file" not in (out + err), f"{rc} {out[:300]} {err[:300]}")
    write("one/model_config.yaml", OK)
    rc, out, err = run(["--json", "--format", "github", "--from-yaml", "one"], d)
    expect("--json with --format github: refused (one would silently win)", rc == 2 and "choose one of --json and --format github" in err,
           f"{rc} {out[:300]} {err}")

    # Argument files that fan out (each naming the next three times: 3^15 reads), that never end
    # (/dev/zero) or block (a FIFO): refused before they are read, naming the file.
    for i in range(15):
        write(f"fan/{i}.txt", " ".join([f"@fan/{i + 1}.txt"] * 3) + "\n")
    write("fan/15.txt", "--num-layers 4\n")
    rc, out, err = run(["@fan/0.txt"], d)
    expect("argument files that name each other 3^15 times: refused at the cap", rc == 2 and "more than 1000 argument files read" in err,
           f"{rc} {out} {err}")
    rc, out, err = run(["@/dev/zero"], d)
    expect("@/dev/zero: not a regular file, refused before reading", rc == 2 and "/dev/zero is not a regular file" in err, f"{rc} {err}")
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    rc, out, err = run(["@fifo"], d)
    expect("a FIFO as @file: refused, not read (it would block)", rc == 2 and "fifo is not a regular file" in err, f"{rc} {err}")
    rc, out, err = run(["--from-yaml", "fifo"], d)
    expect("a FIFO as --from-yaml: refused, not read", rc == 2 and "fifo is not a regular file" in (out + err), f"{rc} {out} {err}")
    with open(os.path.join(d, "huge.txt"), "wb") as f:
        f.truncate(17 << 20)
    rc, out, err = run(["@huge.txt"], d)
    expect("an argument file past 16 MiB: refused before it is read", rc == 2 and "huge.txt is 17825792 bytes, more than the 16 MiB" in err,
           f"{rc} {err}")
    write("mib.txt", "--num-layers 4\n" * ((1 << 20) // 15 + 1))
    write("mib_many.txt", "@mib.txt " * 20)
    rc, out, err = run(["@mib_many.txt"], d)
    expect("a 1 MiB argument file named 20 times: refused at 4 MiB in all, not read 20 times", rc == 2 and "more than 4 MiB in all" in err,
           f"{rc} {err[:300]}")

    # A directory that cannot be read, and one whose names can be read but whose entries cannot
    # be looked at (r--): as an unprivileged user where this runs as root.
    if os.geteuid() == 0 and shutil.which("setpriv"):
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        os.chmod(d, 0o755)
        write("locked/open/model_config.yaml", OK)
        write("locked/shut/model_config.yaml", S2)
        write("locked/listed/sub/model_config.yaml", S2)
        os.chmod(os.path.join(d, "locked", "shut"), 0o000)
        os.chmod(os.path.join(d, "locked", "listed"), 0o444)
        p = subprocess.run(as_nobody + [check, "--from-yaml", "locked"], capture_output=True, text=True, cwd=d)
        os.chmod(os.path.join(d, "locked", "shut"), 0o755)
        os.chmod(os.path.join(d, "locked", "listed"), 0o755)
        if p.returncode == 126 or p.returncode == 127 or "Permission denied" in p.stderr and not p.stdout:
            print(f"note: the unreadable-directory cases need {check} to be runnable by nobody; not run here ({p.stderr.strip()[:200]})")
        else:
            expect("an unreadable directory in a tree is named, not skipped",
                   p.returncode == 2 and "locked/shut: USAGE ERROR: cannot read the directory locked/shut" in p.stdout
                   and "locked/open/model_config.yaml: VALID" in p.stdout, f"{p.returncode} {p.stdout} {p.stderr}")
            expect("a directory whose entries cannot be looked at is named, not skipped",
                   "locked/listed/sub: USAGE ERROR: cannot " in p.stdout, f"{p.returncode} {p.stdout} {p.stderr}")
    else:
        print("note: not root, or no setpriv: the unreadable-directory cases are not run here")

print(f"{len(failures) == 0 and 1 or 0} passed, {len(failures) and 1 or 0} failed")
sys.exit(1 if failures else 0)
