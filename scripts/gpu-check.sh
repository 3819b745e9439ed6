#!/usr/bin/env bash
# One batch for the GPU machine: build (release, sm_90 included), run the `gpu` suite (gradient
# checks, determinism, padding, MoE modes, CUDA layer, the training demo), then memcheck the
# GPU test executables once. Logs go to $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/capscope-gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  meson --version
  for h in /usr/include/boost/hana.hpp /usr/include/doctest/doctest.h /usr/include/CLI/CLI.hpp /usr/include/nlohmann/json.hpp /usr/include/fmt/core.h; do
    [ -e "$h" ] && echo "have $h" || echo "missing $h"
  done
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# capscope-check's libraries (CLI11, nlohmann-json, fmt) are not needed here.
rm -rf build-gpu
meson setup build-gpu --buildtype=release -Dtools=false >"$OUT/build.log" 2>&1 &&
  meson compile -C build-gpu >>"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: ok"

meson test -C build-gpu --suite gpu --verbose --num-processes 4 >"$OUT/gpu-suite.log" 2>&1
suite_rc=$?
cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt"

sanitizer_rc=0
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  : >"$OUT/memcheck.log"
  for t in test_cuda_layer test_model test_gradients; do
    # API errors are provoked on purpose by some tests (and checked); memcheck is about memory.
    # The allocation test is left out: the sanitizer's own bookkeeping allocates device memory.
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
      "build-gpu/tests/gpu_$t" --test-case-exclude='*allocates no device memory*' >>"$OUT/memcheck.log" 2>&1
    rc=$?
    echo "memcheck gpu_$t: exit $rc" | tee -a "$OUT/memcheck.log"
    [ $rc -eq 0 ] || sanitizer_rc=$rc
  done
fi

grep -E "^ *(determinism|moe modes|vision padding|capture|dropless capture|drop-and-pad|dropless with)" "$OUT/gpu-suite.log" | head -40
grep -E "FAIL|rel.err" "$OUT/gpu-suite.log" | grep -E "FAIL" | head -40
grep -E "^step|^loss|^training" "$OUT/gpu-suite.log" | head -40
grep -E "ERROR SUMMARY|memcheck gpu_" "$OUT/memcheck.log" 2>/dev/null
tail -15 "$OUT/testlog.txt" | grep -E "Ok:|Fail:|Skipped:|Timeout:"
echo "suite exit $suite_rc, memcheck exit $sanitizer_rc"
[ $suite_rc -eq 0 ] && [ $sanitizer_rc -eq 0 ]
