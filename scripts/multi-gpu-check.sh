#!/usr/bin/env bash
# The multi-GPU batch for the 2-GPU machine (device kind nvidia-h200-x2): build the data-parallel
# test (release), run it as one rank and as two (mpirun -np 2, one process per GPU), run it under
# compute-sanitizer (memory errors; NCCL's own probing of kernels built for other GPUs shows as
# API errors it handles, not reported), and run the fork-launcher experiment of docs/multi_gpu.md with NCCL_DEBUG=INFO.
# Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/capscope-gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/multi-build.log" 2>&1
cat "$OUT/multi-build.log"
if [ ! -f build-mpi/build.ninja ]; then
  meson setup build-mpi --buildtype=release -Dtools=false >>"$OUT/multi-build.log" 2>&1 || { tail -40 "$OUT/multi-build.log"; exit 1; }
fi
ninja -C build-mpi tests/gpu_test_data_parallel tests/gpu_test_nccl >>"$OUT/multi-build.log" 2>&1 || { tail -40 "$OUT/multi-build.log"; exit 1; }
echo "build: ok"
rc=0
run() { # name, command...
  local name=$1; shift
  timeout 150 "$@" >"$OUT/$name.log" 2>&1; local r=$?
  echo "== $name: exit $r"; grep -E "data parallel|planned different|test cases|assertions|Status|ERROR SUMMARY|RACECHECK|error" "$OUT/$name.log" | head -20
  [ $r -eq 0 ] || rc=1
}
run one-rank ./build-mpi/tests/gpu_test_data_parallel
run two-ranks mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE ./build-mpi/tests/gpu_test_data_parallel
run two-ranks-memcheck mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 ./build-mpi/tests/gpu_test_data_parallel
g++ -std=c++20 -O1 -I/usr/local/cuda/include tools/launch_probe/fork_probe.cpp -L/usr/local/cuda/lib64 -lcudart -lnccl -o build-mpi/fork_probe
for v in clean cuda id; do
  NCCL_DEBUG=INFO timeout 60 ./build-mpi/fork_probe $v >"$OUT/fork-$v.log" 2>&1
  echo "== fork $v: exit $?"; grep -E "fork_probe|rank [01]:|WARN|error" "$OUT/fork-$v.log" | tail -8
done
echo "multi-gpu-check exit $rc"
exit $rc
