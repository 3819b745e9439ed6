#!/usr/bin/env bash
# Where one training step's device time goes, capscope's whole-step graph beside a PyTorch variant
# of the same model: ncu times every kernel of one step of each (after warmup, from
# cudaProfilerStart / torch.cuda.profiler.start to stop), and bench/kernel_breakdown.py sums them
# by what they do. Writes under $OUT: capscope-ncu.csv, pytorch-ncu.csv, breakdown.md.
#
#   bench/profile.sh [BUILD_DIR]   (default build-gpu, a release build)
#   SIZE="H S B L" (default "2048 2048 1 12"), PATTERN=dense|mixed, VARIANT (gpt_peer.py's name,
#   default "torch.compile"; GPT_PEER_CUDAGRAPH_TREES=0 for reduce-overhead with the trees off)
#
# ncu runs the kernels one at a time at the clocks it finds (--clock-control none, as the GPU
# machine's notes ask), so the sums say where the time goes, not how long a step takes: the
# step times are bench/run_all.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/capscope-profile}
SIZE=${SIZE:-2048 2048 1 12}
PATTERN=${PATTERN:-dense}
VARIANT=${VARIANT:-torch.compile}
case $PATTERN in dense | mixed) ;; *) echo "profile: PATTERN is '$PATTERN', not dense or mixed" >&2; exit 2 ;; esac
read -r h s b l <<<"$SIZE"
export PATH="/usr/local/cuda/bin:$PATH"
for dir in /opt/nvidia/nsight-compute/*/; do [ -x "$dir/ncu" ] && PATH="$PATH:$dir"; done # where the GPU machine's image keeps it
command -v ncu >/dev/null || { echo "profile: ncu (Nsight Compute) is not on the PATH: skipped"; exit 77; }
mkdir -p "$OUT"
d="$OUT/model"
rm -rf "$d"
flag=()
[ "$PATTERN" = mixed ] && flag=(--mixed)
ncu_csv() { # FILE COMMAND...: one profiled range of COMMAND, every kernel's duration, as CSV in FILE
  local file=$1
  shift
  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
    --log-file "$file" "$@"
}
ncu_csv "$OUT/capscope-ncu.csv" "$BUILD/bench/same_model" --hidden "$h" --seq "$s" --batch "$b" --layers "$l" "${flag[@]}" \
  --check-steps 1 --profile --out "$d" || { echo "profile: capscope's step under ncu failed (see $OUT/capscope-ncu.csv)"; exit 1; }
ncu_csv "$OUT/pytorch-ncu.csv" python3 bench/peers/gpt_peer.py "$d" --profile "$VARIANT" ||
  { echo "profile: PyTorch's step under ncu failed (see $OUT/pytorch-ncu.csv)"; exit 1; }
echo "h$h s$s b$b L$l, $PATTERN: capscope whole-step graph against PyTorch $VARIANT (ncu, one step each)"
python3 bench/kernel_breakdown.py --out "$OUT/breakdown.md" capscope="$OUT/capscope-ncu.csv" "PyTorch $VARIANT"="$OUT/pytorch-ncu.csv"
