"""The PyTorch peer (bench/peers/gpt_model.py) against the float64 reference, on the CPU.

usage: peer_reference.py SOURCE_ROOT PEER_REFERENCE_CASE

The GPU suite checks the CUDA model against the float64 reference (tests/gpu/reference.cpp); the
peer's same-work check compares the peer with the CUDA model, on the GPU. This test closes the
triangle without a GPU. For tiny models with every layer kind (MoE with tokens dropped, the
Mamba-style scan), peer_reference_case writes the reference's weights, batch, routing, loss and
central-difference gradients. The peer, built from those weights in float64 and routed as the
reference routed (as gpt_peer.py's check routes its first step as capscope's), must give the same
loss and every parameter the same gradient, and its own top-k choices must be the reference's.
Then each breakage of bench/peers/breakages.py that edits the model is applied to a copy of the
peer, and the comparison must fail for each: the test can go red. Exits 77 without torch
(scripts/install-deps.sh --tests installs Debian's python3-torch).
"""
import importlib.util
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped (scripts/install-deps.sh --tests installs python3-torch)")
    sys.exit(77)

SOURCE, CASE = sys.argv[1], sys.argv[2]
PEERS = os.path.join(SOURCE, "bench", "peers")
sys.path.insert(0, PEERS)
import breakages  # noqa: E402  (bench/peers/breakages.py: the edits)
import gpt_peer  # noqa: E402  (bench/peers/gpt_peer.py: its readers of the batch and routing files)

# (layer pattern, capacity factor, seed): every layer kind, in the bench's mixed order and in
# another; both capacities drop assignments (the test asks that they do).
CASES = [("EDMD", 0.5, 21), ("MED", 1.0, 22)]
# The peer in float64 still computes its norms, router logits, scan, MoE combine and loss in
# fp32 (.float() in gpt_model.py, as the CUDA kernels do): about 1e-7 relative each. The
# central differences of the reference are good to about 1e-8. The breakages move the loss by
# 1e-2 or more and some gradient by 1e-1 or more.
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4
# No near ties at these sizes in float64: every choice agrees, where the GPU check asks 98%.
ROUTING_AGREEMENT = 1.0


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """F.scaled_dot_product_attention as PyTorch 2 defines it, for a torch without it (Debian 12
    has PyTorch 1.13): softmax(q k^T * scale + causal mask) v, scale 1/sqrt(head dim) by default."""
    assert attn_mask is None and dropout_p == 0.0
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        s = q.shape[-2]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v


if not hasattr(F, "scaled_dot_product_attention"):
    F.scaled_dot_product_attention = sdpa


def load_model_module(directory, tag):
    """gpt_model.py of `directory` as a module of its own, computing in float64."""
    spec = importlib.util.spec_from_file_location(f"gpt_model_{tag}", os.path.join(directory, "gpt_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.DT = torch.float64
    return module


def reference_case(into, pattern, capacity, seed):
    """The reference's loss, and the assignments each MoE layer dropped."""
    subprocess.run([CASE, into, pattern, str(capacity), str(seed)], check=True)
    lines = [line.split() for line in open(os.path.join(into, "reference.txt"))]
    return next(float(w[1]) for w in lines if w[0] == "loss"), [int(w[2]) for w in lines if w[0] == "dropped"]


def compare(gpt_model, case_dir, reference_loss):
    """(relative loss difference, largest relative L2 gradient difference, its parameter, share of
    the peer's own routing choices that were the reference's; 1 without MoE)."""
    meta, w = gpt_model.load_safetensors(os.path.join(case_dir, "weights.safetensors"))
    cfg = gpt_model.config_of(meta)
    _, want = gpt_model.load_safetensors(os.path.join(case_dir, "gradients.safetensors"))
    (tokens, labels), = gpt_peer.batches(os.path.join(case_dir, "batch.bin"), cfg, 1, device="cpu")
    routing = gpt_peer.routing_of(os.path.join(case_dir, "routing.bin"), cfg, device="cpu")
    model = gpt_model.Peer(cfg, w)
    moes = [part for layer in model.layers for part in layer if isinstance(part, gpt_model.MoE)]
    for moe, forced in zip(moes, routing):
        moe.forced = forced
    loss = model(tokens, labels)
    loss.backward()
    names = model.by_capscope_name()
    if set(names) != set(want):
        raise SystemExit(f"the peer's parameters {sorted(set(names) ^ set(want))} are not the reference's, or the reverse")
    worst, worst_name = 0.0, ""
    for name, p in names.items():
        g = want[name].double()
        d = ((p.grad.double().view(-1) - g).norm() / g.norm()).item()
        if d > worst:
            worst, worst_name = d, name
    agreed = sum(m.agreed.item() for m in moes) / sum(r.numel() for r in routing) if moes else 1.0
    return abs(loss.item() - reference_loss) / abs(reference_loss), worst, worst_name, agreed


def same(loss_diff, grad_diff, _name, agreed):
    return loss_diff <= LOSS_TOLERANCE and grad_diff <= GRAD_TOLERANCE and agreed >= ROUTING_AGREEMENT


def main():
    failures = 0
    peer = load_model_module(PEERS, "peer")
    print(f"torch {torch.__version__}{'' if F.scaled_dot_product_attention is not sdpa else ' (its attention is the sdpa above)'}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for pattern, capacity, seed in CASES:
            case_dir = os.path.join(tmp, pattern)
            os.mkdir(case_dir)
            loss, dropped = reference_case(case_dir, pattern, capacity, seed)
            cases.append((pattern, case_dir, loss))
            loss_diff, grad_diff, name, agreed = result = compare(peer, case_dir, loss)
            ok = same(*result) and any(dropped)
            failures += not ok
            print(f"{pattern} (capacity factor {capacity}, {sum(dropped)} assignments dropped): loss {loss:.6f}, relative "
                  f"difference {loss_diff:.1e} (tolerance {LOSS_TOLERANCE:.0e}); gradients within {grad_diff:.1e} "
                  f"({name}; tolerance {GRAD_TOLERANCE:.0e}); routing choices agreed {agreed:.1%}: {'same' if ok else 'NOT THE SAME'}")
        pattern, case_dir, loss = cases[0]
        for i, (what, needs, file, old, new) in enumerate(breakages.BREAKAGES):
            if file != "gpt_model.py":
                print(f"not reached here: {what} ({file}; the reference has no optimizer)")
                continue
            assert set(needs) & set(pattern)
            code = os.path.join(tmp, "broken")
            os.makedirs(code, exist_ok=True)
            breakages.broken_copy(code, file, old, new)
            loss_diff, grad_diff, name, agreed = result = compare(load_model_module(code, f"broken{i}"), case_dir, loss)
            red = not same(*result)
            failures += not red
            print(f"broken on purpose, {what}: {'red' if red else 'NOT RED'} (on {pattern}: loss {loss_diff:.1e}, "
                  f"gradients {grad_diff:.1e} ({name}), routing {agreed:.1%})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
