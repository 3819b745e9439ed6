#!/usr/bin/env python3
"""The example model in PyTorch: the peer that bench/same_model compares capscope with.

usage: python3 bench/peers/gpt_peer.py DIR [--steps N]

DIR is what bench/same_model wrote: weights.safetensors (the C++ model's initial fp32 master
weights, its config in the metadata), batches.bin and losses.txt. The peer builds the same model
(dense layers: token + position embedding; per layer RMSNorm -> QKV -> causal softmax attention
-> output projection + residual, RMSNorm -> fc1 -> tanh GELU -> fc2 + residual; final RMSNorm,
LM head, mean cross-entropy over labels != -1) with fp32 master weights, bf16 working copies
and activations, and AdamW (lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.01, on every
parameter) as the C++ model has.

1. The check: N training steps from the same weights on the same batches; every loss must agree
   with capscope's, and every parameter's gradient after the first step with capscope's
   (gradients_step1.safetensors), within the tolerances below, or the peer exits 1.
2. The timing: median device ms of a whole training step (zero grads, forward, backward, AdamW)
   under eager, torch.compile (default), torch.compile(mode="reduce-overhead"),
   make_graphed_callables per layer, and one torch.cuda.graph of the whole step.
Writes DIR/peer.csv (variant,ms) and DIR/peer_check.txt. Exits 77 without torch or a GPU.
"""
import json
import math
import os
import struct
import subprocess
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

from timing import median_ms  # bench/peers/timing.py

# bf16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4%); the two implementations round
# at different places (the peer's attention is fused, its weight gradients pass through bf16), so
# losses drift apart a little over the steps (at most 0.09% over the first 10 on the H100). A
# dropped causal mask moved them by 5%; a halved attention scale did not move them at all beyond
# rounding, so the first step's gradients are compared too.
TOLERANCE = 0.02
# The peer's weight gradients pass through bf16 (capscope's cuBLAS writes them in fp32 from bf16
# inputs): up to 2.2% relative L2 difference on the H100 at the bench's sizes. Halving the
# attention scale gave 11% (layer0.qkv) while the losses stayed within 0.05%; dropping the causal
# mask, 109%.
GRAD_TOLERANCE = 0.05
DT = torch.bfloat16


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__")
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        a, b = info["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32)
    return meta, tensors


def rms_norm(x, g):
    """As the C++ kernel: in fp32 from the bf16 input, eps 1e-5, one rounding to bf16."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * g.float()).to(x.dtype)


def residual_matmul(x, a, w):
    """x + a @ w with one rounding, as the C++ model's cuBLAS call with beta 1."""
    shape = x.shape
    return torch.addmm(x.reshape(-1, shape[-1]), a.reshape(-1, a.shape[-1]), w).view(shape)


class Layer(nn.Module):
    def __init__(self, cfg, w, i):
        super().__init__()
        h, f = cfg["hidden"], cfg["ffn_hidden"]
        p = lambda name, *shape: nn.Parameter(w[f"layer{i}.{name}"].clone().view(*shape))
        self.heads = cfg["heads"]
        self.input_norm, self.qkv, self.proj = p("input_norm", h), p("qkv", h, 3 * h), p("proj", h, h)
        self.pre_mlp_norm, self.fc1, self.fc2 = p("pre_mlp_norm", h), p("fc1", h, f), p("fc2", f, h)

    def forward(self, x):
        b, s, h = x.shape
        dh = h // self.heads
        qkv = rms_norm(x, self.input_norm.to(DT)) @ self.qkv.to(DT)
        q, k, v = qkv.view(b, s, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = residual_matmul(x, ctx, self.proj.to(DT))
        act = F.gelu(rms_norm(x, self.pre_mlp_norm.to(DT)) @ self.fc1.to(DT), approximate="tanh")
        return residual_matmul(x, act, self.fc2.to(DT))


class Peer(nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        v, h, s = cfg["vocab"], cfg["hidden"], cfg["seq_len"]
        self.tokens = nn.Parameter(w["embedding.tokens"].clone().view(v, h))
        self.positions = nn.Parameter(w["embedding.positions"].clone().view(s, h))
        self.layers = nn.ModuleList(Layer(cfg, w, i) for i in range(len(cfg["layer_pattern"])))
        self.final_norm = nn.Parameter(w["final_norm"].clone().view(h))
        self.head = nn.Parameter(w["lm_head"].clone().view(h, v))

    def embed(self, tokens):
        return self.tokens.to(DT)[tokens] + self.positions.to(DT)[: tokens.shape[1]]

    def loss(self, x, labels):
        logits = rms_norm(x, self.final_norm.to(DT)) @ self.head.to(DT)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-1)

    def by_capscope_name(self):
        """Each parameter under the name the C++ model declared it with."""
        names = {"embedding.tokens": self.tokens, "embedding.positions": self.positions, "final_norm": self.final_norm, "lm_head": self.head}
        for i, layer in enumerate(self.layers):
            for part in ("input_norm", "qkv", "proj", "pre_mlp_norm", "fc1", "fc2"):
                names[f"layer{i}.{part}"] = getattr(layer, part)
        return names

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.loss(x, labels)


def config_of(meta):
    cfg = {k: (v if k in ("layer_pattern", "moe_mode") else float(v) if "." in v else int(v)) for k, v in meta.items()}
    if set(cfg["layer_pattern"]) != {"D"}:
        raise SystemExit(f"gpt_peer: layer pattern {cfg['layer_pattern']!r}: the peer has dense layers only so far")
    return cfg


def batches(path, cfg, n):
    t = cfg["batch"] * cfg["seq_len"]
    raw = open(path, "rb").read()
    ints = torch.frombuffer(bytearray(raw), dtype=torch.int32).to(torch.long)
    out = []
    for i in range(n):
        chunk = ints[2 * t * i: 2 * t * (i + 1)]
        shape = (cfg["batch"], cfg["seq_len"])
        out.append((chunk[:t].view(shape).cuda(), chunk[t:].view(shape).cuda()))
    return out


def adamw(params, capturable=False):
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True, capturable=capturable)


def eager_step(model, opt, tokens, labels):
    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(tokens, labels)
        loss.backward()
        opt.step()
        return loss
    return step


def variants(cfg, w, tokens, labels):
    """(name, make) pairs; make() returns a step function on a fresh model from the same weights."""
    def fresh():
        m = Peer(cfg, w).cuda()
        return m, adamw(m.parameters())

    def eager():
        m, opt = fresh()
        return eager_step(m, opt, tokens, labels)

    def compiled(mode):
        def make():
            m, opt = fresh()
            cm = torch.compile(m, mode=mode)

            def step():
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                opt.zero_grad(set_to_none=False)
                cm(tokens, labels).backward()
                opt.step()
            return step
        return make

    def per_layer():
        m, opt = fresh()
        x = torch.randn(tokens.shape[0], tokens.shape[1], cfg["hidden"], device="cuda", dtype=DT, requires_grad=True)
        m.layers = nn.ModuleList(torch.cuda.make_graphed_callables(tuple(m.layers), tuple((x,) for _ in m.layers)))
        return eager_step(m, opt, tokens, labels)

    def whole_step():
        m = Peer(cfg, w).cuda()
        opt = adamw(m.parameters(), capturable=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            for _ in range(3):
                opt.zero_grad(set_to_none=False)
                m(tokens, labels).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.zero_grad(set_to_none=False)
            m(tokens, labels).backward()
            opt.step()
        return graph.replay

    return [("eager", eager), ("torch.compile", compiled("default")), ("torch.compile reduce-overhead", compiled("reduce-overhead")),
            ("make_graphed_callables per layer", per_layer), ("whole-step torch.cuda.graph", whole_step)]


def check(cfg, w, data, want, want_grads):
    """The losses of every step, and every parameter's gradient after the first step (the early
    losses hardly see the attention scale or mask: the scores of small initial weights are near
    zero, so a softmax of them is near uniform whatever they are scaled by; their gradients
    are not). Returns the largest relative loss difference, the largest relative gradient
    difference (L2, per parameter) and a line per step."""
    model = Peer(cfg, w).cuda()
    opt = adamw(model.parameters())
    worst, worst_grad, worst_name, lines = 0.0, 0.0, "", []
    for i, (tokens, labels) in enumerate(data):
        loss = eager_step(model, opt, tokens, labels)().item()
        rel = abs(loss - want[i]) / abs(want[i])
        worst = max(worst, rel)
        lines.append(f"step {i + 1:3d}  capscope {want[i]:.5f}  peer {loss:.5f}  relative difference {rel:.2e}")
        if i == 0:
            for name, p in model.by_capscope_name().items():
                g = want_grads[name].cuda()
                d = ((p.grad.view(-1) - g).norm() / g.norm()).item()
                if d > worst_grad:
                    worst_grad, worst_name = d, name
            lines.append(f"step   1 gradients: largest relative L2 difference {worst_grad:.2e} ({worst_name})")
    return worst, worst_grad, lines


def time_variant(out, cfg, w, data, name):
    """One variant, in a process of its own (compiled graphs and memory pools of one do not meet
    another's): its median step time, appended to DIR/peer.csv."""
    tokens, labels = data[0]
    make = dict(variants(cfg, w, tokens, labels))[name]
    if os.environ.get("GPT_PEER_CUDAGRAPH_TREES") == "0":
        import torch._inductor.config
        torch._inductor.config.triton.cudagraph_trees = False
        name += " (CUDA-graph trees off)"
    ms = median_ms(make())
    print(f"torch {name:34s} {ms:9.3f} ms/step", flush=True)
    with open(f"{out}/peer.csv", "a") as f:
        f.write(f"{name},{ms}\n")


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    out = args[0]
    if not torch.cuda.is_available():
        print("no usable CUDA device: skipped")
        sys.exit(77)
    meta, w = load_safetensors(f"{out}/weights.safetensors")
    cfg = config_of(meta)
    want = [float(x) for x in open(f"{out}/losses.txt").read().split()]
    data = batches(f"{out}/batches.bin", cfg, len(want))
    torch.manual_seed(0)
    if len(args) == 3 and args[1] == "--variant":
        time_variant(out, cfg, w, data, args[2])
        return

    _, want_grads = load_safetensors(f"{out}/gradients_step1.safetensors")
    worst, worst_grad, lines = check(cfg, w, data, want, want_grads)
    same = worst <= TOLERANCE and worst_grad <= GRAD_TOLERANCE
    verdict = f"same work: {len(want)} steps from the same weights and batches, largest relative loss difference {worst:.2e} " \
              f"(tolerance {TOLERANCE}), first step's gradients within {worst_grad:.2e} (tolerance {GRAD_TOLERANCE}): " \
              f"{'yes' if same else 'NO'}"
    with open(f"{out}/peer_check.txt", "w") as f:
        f.write("\n".join(lines + [verdict]) + "\n")
    print(lines[0], lines[-1], verdict, sep="\n")
    if not same:
        sys.exit(1)

    with open(f"{out}/peer.csv", "w") as f:
        f.write("variant,ms\n")
    failed = []
    for name, _ in variants(cfg, w, *data[0]):
        run = lambda env: subprocess.run([sys.executable, __file__, out, "--variant", name], stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env=env)
        r = run(None)
        if r.returncode != 0 and "overwritten by a subsequent run" in r.stdout:
            # PyTorch 2.11's CUDA-graph trees stop this model's backward with this error (its
            # saved activations, it says, were overwritten by a later replay); its older
            # per-graph cudagraphify runs the same compiled code.
            print(f"torch {name}: CUDA-graph trees raised 'accessing tensor output of CUDAGraphs that has been overwritten "
                  f"by a subsequent run'; again with the trees off", flush=True)
            r = run(dict(os.environ, GPT_PEER_CUDAGRAPH_TREES="0"))
        print(r.stdout.strip().splitlines()[-1] if r.returncode == 0 else f"torch {name}: FAILED\n{r.stdout[-3000:]}", flush=True)
        if r.returncode != 0:
            failed.append(name)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
