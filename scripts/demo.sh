#!/usr/bin/env bash
# From a fresh Debian machine (with the CUDA Toolkit) to the main demo: the first tutorial and
# capscope-check on a Megatron command line; on a machine with a GPU, also a capture tutorial
# (tutorial 10: a trainer of its own under three impls, its speedup and its bitwise check).
# It builds only what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
[ -d build ] || meson setup build --buildtype=debugoptimized
gpu=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=yes; fi
targets=(01_first_config capscope-check)
[ "$gpu" = yes ] && [ -f build/build.ninja ] && grep -q '10_custom_trainer' build/build.ninja && targets+=(10_custom_trainer)
meson compile -C build "${targets[@]}"
build/examples/01_first_config
echo; echo '$ capscope-check --cuda-graph-impl local --cuda-graph-modules attn moe_router --num-experts 8 --recompute-activations'
build/tools/capscope_check/capscope-check --cuda-graph-impl local --cuda-graph-modules attn moe_router --num-experts 8 \
  --recompute-activations || true
echo
if [[ " ${targets[*]} " == *" 10_custom_trainer "* ]]; then
  echo '$ build/examples/10_custom_trainer   # captured vs eager, bit for bit'
  build/examples/10_custom_trainer | grep -E '^==|bitwise equal|^every run|FAIL'
else
  echo "no GPU here: the capture tutorials (examples/02-12) build with nvcc and run on a machine with one"
fi
