#!/usr/bin/env bash
# The fused attention kernels beside PyTorch's scaled_dot_product_attention, one run, one shape:
# bench/attention (capscope's kernels) then bench/peers/attention_peer.py (cuDNN, FlashAttention-2).
#
#   bench/attention.sh [BUILD_DIR]   (default build-gpu, a release build)
#   SHAPE="B S HEADS HEAD_DIM" (default "1 2048 32 64": the dense and mixed models at h2048)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
read -r b s n d <<<"${SHAPE:-1 2048 32 64}"
"$BUILD/bench/attention" --batch "$b" --seq "$s" --heads "$n" --head-dim "$d" || exit $?
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 bench/peers/attention_peer.py --batch "$b" --seq "$s" --heads "$n" --head-dim "$d"
else
  echo "torch with CUDA is not importable: the peer's lines are skipped"
fi
