#!/usr/bin/env bash
# The benchmarks the GPU machine runs end to end, in one lease. So far: the example model beside
# its PyTorch peer at the three sizes of issue 17 (bf16, dense, vocab 256, a whole training step
# with AdamW), with the check that both do the same work; one Markdown table and one CSV.
#
#   bench/run_all.sh [BUILD_DIR]   (default build-gpu, a release build; writes under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/capscope-bench}
mkdir -p "$OUT"
rc=0
dirs=()
sizes=("512 128 1 24" "1024 512 2 24" "2048 2048 1 12")
[ -n "${SIZES:-}" ] && IFS=, read -ra sizes <<<"$SIZES" # e.g. SIZES="512 128 1 24,1024 512 2 24"
for size in "${sizes[@]}"; do
  read -r h s b l <<<"$size"
  d="$OUT/peer-h$h-s$s-b$b-L$l"
  "$BUILD/bench/same_model" --hidden "$h" --seq "$s" --batch "$b" --layers "$l" --out "$d" 2>&1 | tee "$d.log" || { rc=1; continue; }
  PYTHONUNBUFFERED=1 python3 bench/peers/gpt_peer.py "$d" 2>&1 | tee -a "$d.log"
  prc=${PIPESTATUS[0]}
  [ "$prc" -eq 0 ] && dirs+=("$d") || rc=$prc
  rm -f "$d/weights.safetensors" "$d/gradients_step1.safetensors" "$d/batches.bin" # large, and only the peer reads them
done
[ ${#dirs[@]} -gt 0 ] && python3 bench/peer_table.py "$OUT/peer.md" "$OUT/peer.csv" "${dirs[@]}"
echo "run_all exit $rc"
exit $rc
