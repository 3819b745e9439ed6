"""The example model in PyTorch, built from the C++ model's weights and config (what
bench/peers/gpt_peer.py checks and times): token + position embedding; the layers of the
config's pattern (D: attention + MLP, E: attention + drop-and-pad MoE, M: the Mamba-style gated
recurrence), each computed as the C++ kernels compute it, in bf16 with fp32 where they use it;
final RMSNorm, LM head, mean cross-entropy over labels != -1."""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

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


def linear_scan(a, b):
    """h_t = a_t h_(t-1) + b_t from h_(-1) = 0, along dim 1, in log2(seq) steps (Hillis-Steele):
    after the step of width w, element t holds the composition of the maps (t - 2w, t]. PyTorch has
    no scan kernel for this recurrence; this form is what torch.compile fuses and graphs capture."""
    w = 1
    while w < a.shape[1]:
        b = torch.cat((b[:, :w], b[:, w:] + a[:, w:] * b[:, :-w]), 1)
        a = torch.cat((a[:, :w], a[:, w:] * a[:, :-w]), 1)
        w *= 2
    return b


class Part(nn.Module):
    """A block's parameters, each under the C++ model's name (layer<i>.<name>)."""

    def __init__(self, w, i, shapes):
        super().__init__()
        self.capscope_names = {}
        for name, shape in shapes.items():
            param = nn.Parameter(w[f"layer{i}.{name}"].clone().view(*shape))
            self.register_parameter(name.replace(".", "_"), param)
            self.capscope_names[f"layer{i}.{name}"] = param


class Attention(Part):
    """RMSNorm -> QKV -> causal softmax attention -> output projection + residual."""

    def __init__(self, cfg, w, i):
        h = cfg["hidden"]
        super().__init__(w, i, {"input_norm": (h,), "qkv": (h, 3 * h), "proj": (h, h)})
        self.heads = cfg["heads"]

    def forward(self, x):
        b, s, h = x.shape
        qkv = rms_norm(x, self.input_norm.to(DT)) @ self.qkv.to(DT)
        q, k, v = qkv.view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        return residual_matmul(x, ctx, self.proj.to(DT))


class Mlp(Part):
    """RMSNorm -> fc1 -> tanh GELU -> fc2 + residual."""

    def __init__(self, cfg, w, i):
        h, f = cfg["hidden"], cfg["ffn_hidden"]
        super().__init__(w, i, {"pre_mlp_norm": (h,), "fc1": (h, f), "fc2": (f, h)})

    def forward(self, x):
        act = F.gelu(rms_norm(x, self.pre_mlp_norm.to(DT)) @ self.fc1.to(DT), approximate="tanh")
        return residual_matmul(x, act, self.fc2.to(DT))


class MoE(Part):
    """Drop-and-pad MoE as the C++ kernels compute it (kernels/moe.cu): RMSNorm -> router logits
    (bf16) -> top-k experts and a softmax over the chosen logits (fp32) -> each expert keeps the
    first `capacity` of its assignments in token order (assignment t*k + j), the rest are dropped ->
    per expert fc1 -> tanh GELU -> fc2 on a padded batch of `capacity` rows -> x + the gate-weighted
    sum of a token's kept outputs, in fp32 with one rounding."""

    def __init__(self, cfg, w, i):
        h, f, e = cfg["hidden"], cfg["ffn_hidden"], cfg["experts"]
        super().__init__(w, i, {"pre_mlp_norm": (h,), "router": (h, e), "experts.fc1": (e, h, f), "experts.fc2": (e, f, h)})
        self.experts, self.k = e, cfg["top_k"]
        self.capacity = math.ceil(cfg["capacity_factor"] * cfg["batch"] * cfg["seq_len"] * self.k / e)
        # The check's first step routes as capscope did (tokens x k expert ids), and counts how
        # many of the peer's own choices capscope also made for that token (in either order:
        # equal logits are ordered by expert id in capscope's kernel, unspecified in topk).
        self.forced, self.agreed = None, None

    def forward(self, x):
        h, e, k, c = x.shape[-1], self.experts, self.k, self.capacity
        xt = x.reshape(-1, h)
        t = xt.shape[0]
        normed = rms_norm(xt, self.pre_mlp_norm.to(DT))
        logits = (normed @ self.router.to(DT)).float()
        top, expert = torch.topk(logits, k, dim=-1)
        if self.forced is not None:
            self.agreed = (expert.unsqueeze(-1) == self.forced.unsqueeze(-2)).any(-1).sum()
            expert, top = self.forced, logits.gather(1, self.forced)
        gate = torch.softmax(top, dim=-1)
        flat = expert.reshape(-1)  # assignment a = token * k + j
        arange = torch.arange(t * k, device=x.device)
        # Its position among its expert's assignments, counted in assignment order.
        pos = (flat[:, None] == torch.arange(e, device=x.device)).to(torch.int32).cumsum(0).gather(1, flat[:, None]).squeeze(1) - 1
        kept = pos < c
        slot = torch.where(kept, flat * c + pos, e * c)  # a dropped assignment goes to a row past the end
        owner = torch.full((e * c + 1,), -1, dtype=torch.long, device=x.device).scatter(0, slot, arange)[: e * c]
        permuted = normed[owner.clamp(min=0) // k] * (owner >= 0).unsqueeze(1).to(DT)  # empty slots are zero rows
        pre = torch.bmm(permuted.view(e, c, h), self.experts_fc1.to(DT))
        out = torch.bmm(F.gelu(pre, approximate="tanh"), self.experts_fc2.to(DT)).view(e * c, h)
        picked = out[slot.clamp(max=e * c - 1)].view(t, k, h)
        weight = (gate * kept.view(t, k)).unsqueeze(-1)
        return (xt.float() + (weight * picked.float()).sum(1)).to(DT).view(x.shape)


class Mamba(Part):
    """The Mamba-style block (kernels/scan.cu): RMSNorm -> in_proj to (u, z, a) -> the gated
    recurrence h_t = s_t h_(t-1) + (1 - s_t) u_t with s = sigmoid(a), in fp32 -> h * silu(z) ->
    out_proj + residual."""

    def __init__(self, cfg, w, i):
        h, d = cfg["hidden"], cfg["mamba_inner"]
        super().__init__(w, i, {"norm": (h,), "in_proj": (h, 3 * d), "out_proj": (d, h)})
        self.inner = d

    def forward(self, x):
        proj = rms_norm(x, self.norm.to(DT)) @ self.in_proj.to(DT)
        u, z, a = proj.float().split(self.inner, dim=-1)
        a = torch.sigmoid(a)
        mixed = (linear_scan(a, (1 - a) * u) * F.silu(z)).to(DT)
        return residual_matmul(x, mixed, self.out_proj.to(DT))


PARTS = {"D": (Attention, Mlp), "E": (Attention, MoE), "M": (Mamba,)}


class Layer(nn.Sequential):
    """One letter of the layer pattern: D dense, E attention + MoE, M Mamba-style."""

    def __init__(self, cfg, w, i, kind):
        super().__init__(*(part(cfg, w, i) for part in PARTS[kind]))


class Peer(nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        v, h, s = cfg["vocab"], cfg["hidden"], cfg["seq_len"]
        self.tokens = nn.Parameter(w["embedding.tokens"].clone().view(v, h))
        self.positions = nn.Parameter(w["embedding.positions"].clone().view(s, h))
        self.layers = nn.ModuleList(Layer(cfg, w, i, kind) for i, kind in enumerate(cfg["layer_pattern"]))
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
        for layer in self.layers:
            for part in layer:
                names.update(part.capscope_names)
        return names

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.loss(x, labels)


def config_of(meta):
    cfg = {k: (v if k in ("layer_pattern", "moe_mode") else float(v) if "." in v else int(v)) for k, v in meta.items()}
    if not set(cfg["layer_pattern"]) <= set(PARTS):
        raise SystemExit(f"gpt_peer: layer pattern {cfg['layer_pattern']!r}: the peer builds D, E and M layers only")
    if "E" in cfg["layer_pattern"] and cfg["moe_mode"] != "drop_and_pad":
        raise SystemExit(f"gpt_peer: moe_mode {cfg['moe_mode']}: the peer's MoE is drop-and-pad only (its shapes must not "
                         "depend on data, for the graphed variants)")
    return cfg
