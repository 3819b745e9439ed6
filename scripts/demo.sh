#!/usr/bin/env bash
# From a fresh Debian machine (with the CUDA Toolkit) to the main demo: the first tutorial and
# capscope-check on a Megatron command line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
[ -d build ] || meson setup build --buildtype=debugoptimized
meson compile -C build
build/examples/01_first_config
echo; echo '$ capscope-check --cuda-graph-impl local --cuda-graph-modules attn moe_router --num-experts 8 --recompute-activations'
build/tools/capscope_check/capscope-check --cuda-graph-impl local --cuda-graph-modules attn moe_router --num-experts 8 \
  --recompute-activations || true
