#!/usr/bin/env bash
# Every benchmark behind docs/performance.md, run end to end on the GPU machine; then one
# report of them (bench/report.py): $OUT/results.md (the tables), $OUT/results.csv (every figure)
# and $OUT/results.svg (the plot).
#
#   bench/run_all.sh [BUILD_DIR]   (default build-gpu, a release build; writes under $OUT)
#
# The parts, in order (PARTS="..." runs some of them, e.g. where one call may not run long):
#   compile    bench/compile_time.py: a TU with capscope.hpp and one config against an empty one, g++ and nvcc
#   runner     bench/runner_overhead: the runner against hand-written graph code, dense and mixed;
#              bench/composed_overhead: the same, composed (hooks on lanes and offload, tutorial 11's model);
#              bench/graph_update: four ways to update a host-valued stage in a graph;
#              bench/graph_mem_ops: memory-operation nodes at launch, as captured and as kernels; and
#              examples/14_existing_trainer_bench: tutorial 14's trainer, its own loop against graphs
#   inference  bench/inference: exec update against instantiation, and one forward by scope
#   peer       bench/same_model beside bench/peers/gpt_peer.py at each size of SIZES, dense and
#              mixed (PATTERNS), with the check that both do the same work
#   breakages  with peer, at the first size: bench/peers/breakages.py breaks the peer on purpose,
#              one way at a time, and the check must go red each time
# Then, locally: python3 bench/report.py --out docs/bench/run_all-h100 --docs docs/performance.md RUN...
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/capscope-bench}
PARTS=${PARTS:-compile runner inference peer breakages}
PATTERNS=${PATTERNS:-dense mixed}
for p in $PARTS; do
  case $p in compile | runner | inference | peer | breakages) ;; *) echo "run_all: unknown part '$p' in PARTS (compile runner inference peer breakages)" >&2; exit 2 ;; esac
done
for p in $PATTERNS; do
  case $p in dense | mixed) ;; *) echo "run_all: unknown pattern '$p' in PATTERNS (dense mixed)" >&2; exit 2 ;; esac
done
if [[ " $PARTS " == *" breakages "* && " $PARTS " != *" peer "* ]]; then
  echo "run_all: PARTS has breakages without peer: the breakages run on the peer's check at the first size; add peer" >&2
  exit 2
fi
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
rc=0
want() { [[ " $PARTS " == *" $1 "* ]]; }
step() { # NAME COMMAND...: runs it, keeps its output in $OUT/NAME.log, remembers a failure (77: skipped)
  local name=$1
  shift
  "$@" 2>&1 | tee "$OUT/$name.log"
  local r=${PIPESTATUS[0]}
  echo "$name exit $r"
  [ "$r" -eq 0 ] || [ "$r" -eq 77 ] || rc=$r
  return "$r"
}

{
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/, / (driver /; s/$/)/')
  printf '%s' "${gpu:-no GPU}"
  printf ', CUDA %s' "$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  printf ', PyTorch %s' "$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
  printf ', %s x %s' "$(nproc)" "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  printf '; %s\n' "$(date -u +%Y-%m-%d)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"

want compile && step compile_time python3 bench/compile_time.py --csv "$OUT/compile_time.csv"
want runner && step runner_overhead "$BUILD/bench/runner_overhead" --csv "$OUT/runner_overhead.csv" --markdown "$OUT/runner_overhead.md"
want runner && step composed_overhead "$BUILD/bench/composed_overhead" --csv "$OUT/composed_overhead.csv" --markdown "$OUT/composed_overhead.md"
want runner && step graph_update "$BUILD/bench/graph_update"
want runner && step graph_mem_ops "$BUILD/bench/graph_mem_ops"
want runner && step existing_trainer "$BUILD/examples/14_existing_trainer_bench"
want inference && step inference "$BUILD/bench/inference" --csv "$OUT/inference.csv" --markdown "$OUT/inference.md"

if want peer; then
  sizes=("512 128 1 24" "1024 512 2 24" "2048 2048 1 12")
  [ -n "${SIZES:-}" ] && IFS=, read -ra sizes <<<"$SIZES" # e.g. SIZES="512 128 1 24,1024 512 2 24"
  for size in "${sizes[@]}"; do
    read -r h s b l <<<"$size"
    for pattern in $PATTERNS; do
      d="$OUT/peer-h$h-s$s-b$b-L$l-$pattern"
      rm -rf "$d" # a run into the same $OUT starts this case afresh: no verdict or breakage of the last one stays
      flag=()
      [ "$pattern" = mixed ] && flag=(--mixed)
      step "peer-h$h-$pattern-capscope" "$BUILD/bench/same_model" --hidden "$h" --seq "$s" --batch "$b" --layers "$l" "${flag[@]}" --out "$d" &&
        PYTHONUNBUFFERED=1 step "peer-h$h-$pattern-pytorch" python3 bench/peers/gpt_peer.py "$d"
      if want breakages && [ "$size" = "${sizes[0]}" ] && grep -q ': yes$' "$d/peer_check.txt" 2>/dev/null; then
        PYTHONUNBUFFERED=1 step "peer-h$h-$pattern-breakages" python3 bench/peers/breakages.py "$d"
      fi
      rm -f "$d/weights.safetensors" "$d/gradients_step1.safetensors" "$d/batches.bin" # large, and only the peer reads them
    done
  done
fi

python3 bench/report.py --out "$OUT" "$OUT" >"$OUT/report.log" 2>&1 || { cat "$OUT/report.log"; rc=1; }
echo "run_all exit $rc"
exit $rc
