#!/usr/bin/env bash
# One batch for the GPU machine: build (release, sm_90 included), run the `gpu` suite (gradient
# checks, determinism, padding, MoE modes, CUDA layer, the runner's parity matrix, the training
# and capture tutorials), memcheck the GPU test executables, and run the benchmarks
# (bench/run_all.sh), and profile one step's kernels beside PyTorch's (bench/profile.sh; and the
# attention kernels alone beside PyTorch's SDPA, bench/attention.sh). Logs go
# to $OUT (the device tool brings them back).
#
#   scripts/gpu-check.sh [all|build|suite|tutorials|memcheck|racecheck|bench|profile]...   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/capscope-gpu-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(all)
want() { for p in "${phases[@]}"; do [ "$p" = all ] || [ "$p" = "$1" ] && return 0; done; return 1; }
rc=0

if want build || [ ! -f build-gpu/build.ninja ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version | tail -2
    meson --version
  } >"$OUT/build.log" 2>&1
  cat "$OUT/build.log"
  # capscope-check's libraries (CLI11, nlohmann-json, fmt) are not needed here.
  rm -rf build-gpu
  meson setup build-gpu --buildtype=release -Dtools=false >>"$OUT/build.log" 2>&1 &&
    meson compile -C build-gpu >>"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
  echo "build: ok"
fi

if want suite; then
  meson test -C build-gpu --suite gpu --verbose --num-processes 4 >"$OUT/gpu-suite.log" 2>&1
  suite_rc=$?
  cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt"
  grep -E "^ *(determinism|moe modes|vision padding|capture|dropless capture|drop-and-pad|dropless with|runner|plan error|fallback|scratch|transformer_engine,|full_iteration:|lanes|forked stream|rethrown|one-rank|bucket runner|inference|rebind|shared exec|guards,|nan_check_on_device)" "$OUT/gpu-suite.log" | head -100
  grep -E "ERROR|FAIL|SUCCESS|Status" "$OUT/gpu-suite.log" | grep -v "^ *runner" | head -40
  grep -E "^step|^loss|^training|^counters|^step time" "$OUT/gpu-suite.log" | head -40
  tail -15 "$OUT/testlog.txt" | grep -E "Ok:|Fail:|Skipped:|Timeout:"
  echo "suite exit $suite_rc"
  [ $suite_rc -eq 0 ] || rc=$suite_rc
fi

if want tutorials; then
  # The capture tutorials again, keeping their plans as DOT (docs/ renders them with Graphviz).
  mkdir -p /tmp/plans && rm -f /tmp/plans/*
  {
    build-gpu/examples/03_partial_capture --dot /tmp/plans/03_partial_capture.dot &&
    build-gpu/examples/04_moe_capture --dot /tmp/plans/04_moe_drop_and_pad.dot --dot /tmp/plans/04_moe_dropless.dot --dot /tmp/plans/04_moe_static_capacity.dot &&
    build-gpu/examples/05_full_iteration --dot /tmp/plans/05_full_iteration.dot &&
    build-gpu/examples/09_activation_offload --dot /tmp/plans/09_activation_offload.dot &&
    build-gpu/examples/12_nan_check --dot /tmp/plans/12_nan_check.dot
  } >"$OUT/tutorials.log" 2>&1
  trc=$?
  if command -v dot >/dev/null; then for d in /tmp/plans/*.dot; do dot -Tsvg "$d" -o "${d%.dot}.svg"; done; fi
  tar -C /tmp -cf "$OUT/plans.tar" plans
  grep -E "^capscope plan|^  [0-9]+ graph|^  per step|^counters|^step time|^plan error|^  capscope plan|learnt|FAIL|^==|^offload plan|^device memory" "$OUT/tutorials.log"
  echo "tutorials exit $trc"
  [ $trc -eq 0 ] || rc=$trc
fi

if want memcheck; then
  : >"$OUT/memcheck.log"
  for t in test_attention test_scan_slots test_norms test_generate test_cuda_layer test_model test_gradients test_runner test_scratch test_inference test_engine test_offload test_hooks test_guards; do
    # API errors are provoked on purpose by some tests (and checked); memcheck is about memory.
    # The allocation tests are left out: the sanitizer's own bookkeeping allocates device memory.
    timeout 540 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
      "build-gpu/tests/gpu_$t" --test-case-exclude='*allocates no device memory*,*allocate no device memory*,*allocate nothing*,*no gradient or optimizer state*,*no host allocation*,*device memory falls*,*copies slower*' >>"$OUT/memcheck.log" 2>&1
    mrc=$?
    echo "memcheck gpu_$t: exit $mrc" | tee -a "$OUT/memcheck.log"
    [ $mrc -eq 0 ] || rc=$mrc
  done
  grep -E "ERROR SUMMARY" "$OUT/memcheck.log"
fi

if want racecheck; then
  # The activation copies order the ring's slots across streams with events: racecheck and
  # synccheck on the offload test's training runs (fp32); then the fused attention kernels.
  : >"$OUT/racecheck.log"
  for tool in racecheck synccheck; do
    timeout 540 compute-sanitizer --tool $tool --error-exitcode 99 build-gpu/tests/gpu_test_offload \
      --test-case='*for the sanitizers*' >>"$OUT/racecheck.log" 2>&1
    xrc=$?
    echo "$tool gpu_test_offload: exit $xrc" | tee -a "$OUT/racecheck.log"
    [ $xrc -eq 0 ] || rc=$xrc
  done
  # The fused attention double-buffers its tiles in shared memory: racecheck its kernels.
  timeout 540 compute-sanitizer --tool racecheck --error-exitcode 99 build-gpu/tests/gpu_test_attention \
    --test-case='*for the sanitizers*' >>"$OUT/racecheck.log" 2>&1
  xrc=$?
  echo "racecheck gpu_test_attention: exit $xrc" | tee -a "$OUT/racecheck.log"
  [ $xrc -eq 0 ] || rc=$xrc
  # The decode attention's scores and the greedy choice's per-warp bests go through shared memory.
  timeout 540 compute-sanitizer --tool racecheck --error-exitcode 99 build-gpu/tests/gpu_test_generate \
    --test-case='*for the sanitizers*' >>"$OUT/racecheck.log" 2>&1
  xrc=$?
  echo "racecheck gpu_test_generate: exit $xrc" | tee -a "$OUT/racecheck.log"
  [ $xrc -eq 0 ] || rc=$xrc
  # The scan's stretch maps and the slot assignment's per-warp counts go through shared memory;
  # the norms reduce through it (block per row) or within a warp.
  for t in test_scan_slots test_norms; do
    timeout 540 compute-sanitizer --tool racecheck --error-exitcode 99 build-gpu/tests/gpu_$t \
      --test-case='*for the sanitizers*' >>"$OUT/racecheck.log" 2>&1
    xrc=$?
    echo "racecheck gpu_$t: exit $xrc" | tee -a "$OUT/racecheck.log"
    [ $xrc -eq 0 ] || rc=$xrc
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK" "$OUT/racecheck.log" | head
fi

if want bench; then
  # Every benchmark behind docs/performance.md (bench/run_all.sh; PARTS, SIZES and PATTERNS pick
  # some of them where one call may not run long), into $OUT/bench with its report.
  OUT="$OUT/bench" bench/run_all.sh build-gpu >"$OUT/bench.log" 2>&1
  brc=$?
  grep -E "exit|same work|ms/step" "$OUT/bench.log" | tail -60
  [ $brc -eq 0 ] || rc=$brc
fi
if want profile; then
  # One step's kernels, capscope's whole-step graph beside PyTorch's torch.compile (bench/profile.sh;
  # SIZE, PATTERN and VARIANT pick another), into $OUT/profile.
  OUT="$OUT/profile" bench/profile.sh build-gpu >"$OUT/profile.log" 2>&1
  prc=$?
  tail -20 "$OUT/profile.log"
  [ $prc -eq 0 ] || [ $prc -eq 77 ] || rc=$prc
  # The attention kernels alone, beside PyTorch's scaled_dot_product_attention (bench/attention.sh).
  bench/attention.sh build-gpu 2>&1 | tee "$OUT/attention.log"
  arc=${PIPESTATUS[0]}
  [ $arc -eq 0 ] || [ $arc -eq 77 ] || rc=$arc
fi
echo "gpu-check exit $rc"
exit $rc
