#!/usr/bin/env bash
# Memory and start-up, capscope beside the PyTorch peer on the same model (docs/performance.md,
# "What graphs cost besides their replays"): bench/graph_cost for capscope's impls, then
# bench/peers/gpt_peer.py --startup for each PyTorch variant, each in a process of its own.
# Run on the GPU machine after `meson setup build-gpu` (scripts/gpu-check.sh makes it).
#
#   bench/graph_cost.sh [BUILD_DIR] [OUT_DIR]     (defaults: build-gpu, /tmp/graph-cost)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${2:-/tmp/graph-cost}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
meson compile -C "$BUILD" same_model graph_cost >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
# The peer's inputs (weights, batches): bench/same_model at the same size, timing one round only.
"$BUILD/bench/same_model" --hidden 1024 --seq 2048 --batch 2 --layers 24 --rounds 1 --out "$OUT/model" >"$OUT/same_model.log" 2>&1 ||
  { tail -20 "$OUT/same_model.log"; exit 1; }
"$BUILD/bench/graph_cost" --layers 24 --hidden 1024 --batch 2 --microbatches 1 | tee "$OUT/graph_cost.log"
i=0
for v in "eager" "make_graphed_callables per layer" "whole-step torch.cuda.graph" "torch.compile" "torch.compile reduce-overhead"; do
  i=$((i + 1))
  if timeout 300 python3 bench/peers/gpt_peer.py "$OUT/model" --startup "$v" >"$OUT/peer_$i.log" 2>&1; then
    tail -1 "$OUT/peer_$i.log"
  else
    # PyTorch 2.11's CUDA-graph trees stop this model's backward (bench/peers/gpt_peer.py says why).
    echo "($v: exit $?, log in $OUT/peer_$i.log; again with the CUDA-graph trees off)"
    GPT_PEER_CUDAGRAPH_TREES=0 timeout 300 python3 bench/peers/gpt_peer.py "$OUT/model" --startup "$v" >"$OUT/peer_${i}b.log" 2>&1
    tail -1 "$OUT/peer_${i}b.log"
  fi
done | tee "$OUT/peer_startup.log"
