#!/usr/bin/env bash
# The multi-GPU batch for the 2-GPU machine (device kind nvidia-h200-x2): build the data-parallel
# test (release), run it as one rank and as two (mpirun -np 2, one process per GPU), run it under
# compute-sanitizer (memory errors; NCCL's own probing of kernels built for other GPUs shows as
# API errors it handles, not reported), inject each fault into rank 1 on the GPUs, eager and captured
# (tests/mpi/gpu_faults.py), run tutorial 08 on two ranks, the data-parallel bench on
# one GPU and on two (table: $OUT/bench-data-parallel.md), and the fork-launcher experiment of
# docs/multi_gpu.md with NCCL_DEBUG=INFO; `profile` traces three variants on 1 and 2 GPUs with
# CUPTI (bench/data_parallel --trace); `launch` times the host's enqueue of one variant on 1 and 2
# GPUs under settings that might make cudaGraphLaunch block (issue 50); `cuts` times issue 50's
# copy-engine variants alone (all on copy engines, one gather a step, memory operations as kernels
# and as nodes, NCCL's event records thinned and kept) on 1, 2 (and 4) GPUs into one table with
# its breakdown ($OUT/bench-cuts.md). The bench part also runs
# bench/pipeline (1F1B on 2 GPUs: eager, a whole-step graph, phases captured once) and
# bench/pipeline_model (the example model pipelined, 1F1B). Logs go to $OUT.
# `quick` is the first call on a newly lent machine: the suite on two ranks (also with NCCL's
# graph-mixing support off), the must-fails that hold graph copies to NCCL's nodes, and
# bench/nccl_graph_launch. `mixing` times four variants with NCCL's graph-mixing support off.
#   scripts/multi-gpu-check.sh [tests] [bench] [profile] [launch] [cuts] [mixing] [fork] [quick]     (default: all but launch, cuts, mixing and quick)
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
ninja -C build-mpi tests/gpu_test_data_parallel tests/rank_failure_probe tests/gpu_fault_probe tests/gpu_test_nccl tests/pipeline_p2p_probe examples/08_data_parallel examples/15_pipeline_trainer bench/data_parallel bench/pipeline bench/pipeline_model bench/nccl_graph_launch >>"$OUT/multi-build.log" 2>&1 || { tail -40 "$OUT/multi-build.log"; exit 1; }
parts=("$@")
echo "build: ok"
rc=0
run() { # name, command...
  local name=$1; shift
  timeout 240 "$@" >"$OUT/$name.log" 2>&1; local r=$?
  echo "== $name: exit $r"; grep -E "data parallel|sharded|example model|ranks x|planned different|test cases|assertions|Status|ERROR SUMMARY|RACECHECK|error|step time|counters|weights" "$OUT/$name.log" | head -60
  [ $r -eq 0 ] || rc=1
}
mpi2=(mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE)
is_part() { [ ${#parts[@]} -eq 0 ] || [[ " ${parts[*]} " == *" $1 "* ]]; }
# Broken on purpose (tests/gpu/breakage.hpp), each must fail on two ranks by a check (the
# pattern), not by a hang or a crash: must_fail NAME BREAKAGE TEST-CASES PATTERN.
# --no-colors: Open MPI gives each rank a terminal, so doctest would colour 'ERROR:' and the grep miss it.
must_fail() {
  local log="$OUT/two-ranks-$1.log"
  CAPSCOPE_BREAK=$2 timeout 240 "${mpi2[@]}" -x CAPSCOPE_BREAK ./build-mpi/tests/gpu_test_data_parallel -tc="$3" --no-colors=true >"$log" 2>&1
  local r=$?; echo "== two-ranks-$1 (must fail): exit $r"; grep -E "ERROR: CHECK|sums wrong|test cases" "$log" | head -6
  [ $r -ne 0 ] && grep -qF "$4" "$log" || rc=1
}
if is_part tests; then
  run one-rank ./build-mpi/tests/gpu_test_data_parallel
  run two-ranks "${mpi2[@]}" ./build-mpi/tests/gpu_test_data_parallel
  # A sum where the average is expected.
  must_fail sum-for-average sum_for_average '*average*' "ERROR: CHECK"
  # The pipelined model's recomputed forward running the forward hooks too.
  must_fail recompute-forward-hooks recompute_forward_hooks '*hooks*' "ERROR: CHECK( counts_right )"
  # The pipelined model's backward passes copying no offloaded tensor back.
  must_fail skip-pass-copy-back skip_pass_copy_back '*offload*' "ERROR: CHECK( same_as_plain )"
  # The all-to-all reduction's sum skipped: it must differ from one all-reduce.
  must_fail skip-all-to-all-sum skip_all_to_all_sum '*each all-reduce an all-to-all*' "ERROR: CHECK( same_as_one_all_reduce )"
  # The memory operations that order NCCL's copy-engine collectives, run as kernels that do not wait.
  must_fail mem-op-waits-skipped mem_op_waits_skipped '*copy-engine all-gather and all-to-all*' "sums wrong"
  # The kept gather called in the last microbatch, not the first.
  must_fail first-microbatch-as-last first_microbatch_as_last '*one gather a step*' "ERROR: CHECK"
  # A failing rank ends both, within the bound (no GPU needed, but here on the real launcher too).
  run rank-failure python3 tests/mpi/rank_failure.py ./build-mpi/tests/rank_failure_probe
  # Each fault injected into rank 1 on the GPUs, eager and captured (23 runs; its own time limit).
  timeout 540 python3 tests/mpi/gpu_faults.py ./build-mpi/tests/gpu_fault_probe >"$OUT/gpu-faults.log" 2>&1
  r=$?; echo "== gpu-faults: exit $r"; grep -E "^[a-z_]+ +[a-z]+ *: exit|^    " "$OUT/gpu-faults.log" | head -120
  [ $r -eq 0 ] || rc=1
  # Broken on purpose: without the watchdog, a rank that stops must hang the other (killed at 30 s).
  CAPSCOPE_BREAK=no_watchdog timeout 120 python3 tests/mpi/gpu_faults.py ./build-mpi/tests/gpu_fault_probe --only stop:full_iteration --hang-s 30 \
    >"$OUT/gpu-faults-no-watchdog.log" 2>&1
  r=$?; echo "== gpu-faults-no-watchdog (must fail): exit $r"; grep -E "^[a-z_]+ +[a-z]+ *:" "$OUT/gpu-faults-no-watchdog.log" | head -4
  [ $r -eq 1 ] && grep -q "a hang" "$OUT/gpu-faults-no-watchdog.log" || rc=1
  # A pipeline step (1F1B, GPipe) with its sends and receives inside one graph, bitwise equal eager,
  # replayed and on the CPU. Then broken on purpose: each send and receive issued alone on one
  # communicator, which the replay check refuses as a deadlock; with 256 MiB messages (past what
  # NCCL's channels buffer) the GPUs must hang (killed at 60 s). With 16 MiB they do not: NCCL's
  # buffers absorb the send, which is why the check assumes no buffering.
  run pipeline-p2p python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe
  # On a machine of 4 GPUs: the suite on 4 ranks (the example model on 2 pipeline replicas of 2
  # ranks among it), and broken on purpose, the replicas not averaged must differ.
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
    run four-ranks mpirun --allow-run-as-root -np 4 -x NCCL_NVLS_ENABLE ./build-mpi/tests/gpu_test_data_parallel
    CAPSCOPE_BREAK=skip_replica_average timeout 240 mpirun --allow-run-as-root -np 4 -x NCCL_NVLS_ENABLE -x CAPSCOPE_BREAK \
      ./build-mpi/tests/gpu_test_data_parallel -tc='*replicas*' --no-colors=true >"$OUT/four-ranks-skip-replica-average.log" 2>&1
    r=$?; echo "== four-ranks-skip-replica-average (must fail): exit $r"; grep -E "replicas|ERROR: CHECK" "$OUT/four-ranks-skip-replica-average.log" | head -4
    [ $r -ne 0 ] && grep -q "ERROR: CHECK" "$OUT/four-ranks-skip-replica-average.log" || rc=1
  fi
  # On a machine of 4 GPUs, the same on 4 ranks (interleaved as Megatron allows it without overlap).
  [ "$(nvidia-smi -L | wc -l)" -ge 4 ] && run pipeline-p2p-4 python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe --ranks 4
  CAPSCOPE_BREAK=skip_replay_check timeout 150 python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe --hang-s 60 \
    -- --kind 1f1b --grouping one_by_one --floats 67108864 --steps 2 --microbatches 2 >"$OUT/pipeline-p2p-one-by-one.log" 2>&1
  r=$?; echo "== pipeline-p2p-one-by-one (must hang): exit $r"; grep -E "hang|rank|FAIL|every case" "$OUT/pipeline-p2p-one-by-one.log" | head -6
  [ $r -eq 1 ] && grep -q "a hang" "$OUT/pipeline-p2p-one-by-one.log" || rc=1
  # Broken on purpose: one pass graph per chunk and direction, whatever the slot, must differ from eager.
  CAPSCOPE_BREAK=pass_graph_per_chunk timeout 150 python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe \
    -- --kind 1f1b --phase-steps 0 >"$OUT/pipeline-pass-graph-per-chunk.log" 2>&1
  r=$?; echo "== pipeline-pass-graph-per-chunk (must fail): exit $r"; grep -E "local|FAIL" "$OUT/pipeline-pass-graph-per-chunk.log" | head -4
  [ $r -eq 1 ] && grep -q "eager != local" "$OUT/pipeline-pass-graph-per-chunk.log" || rc=1
  # A rank that stops taking part in the phased pipeline: the other's watchdog ends the job.
  run pipeline-phases-stop python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe --hang-s 60 --expect-watchdog \
    -- --kind "1f1b phases" --stop-rank 1
  # The same on a communicator per edge, with a fault handler that keeps the process: the
  # watchdog aborts the world's communicator, which must abort the edges split from it.
  run pipeline-edges-stop python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe --hang-s 60 --expect-watchdog \
    -- --grouping one_by_one --stop-rank 1
  # Broken on purpose: the edges left running when the world's is aborted must hang (killed at 40 s).
  CAPSCOPE_BREAK=abort_parent_only timeout 120 python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe --hang-s 40 --expect-watchdog \
    -- --grouping one_by_one --stop-rank 1 >"$OUT/pipeline-edges-stop-parent-only.log" 2>&1
  r=$?; echo "== pipeline-edges-stop-parent-only (must hang): exit $r"; grep -E "hang|watchdog|FAIL|leaving" "$OUT/pipeline-edges-stop-parent-only.log" | head -6
  [ $r -eq 1 ] && grep -q "a hang" "$OUT/pipeline-edges-stop-parent-only.log" || rc=1
  # Broken on purpose: the phases replayed as variant 0 whatever the iteration must differ.
  CAPSCOPE_BREAK=one_phase_variant timeout 150 python3 tests/mpi/pipeline_p2p.py ./build-mpi/tests/pipeline_p2p_probe \
    -- --kind "1f1b phases" >"$OUT/pipeline-phases-one-variant.log" 2>&1
  r=$?; echo "== pipeline-phases-one-variant (must fail): exit $r"; grep -E "phases|FAIL" "$OUT/pipeline-phases-one-variant.log" | head -4
  [ $r -eq 1 ] && grep -q "graph != CPU" "$OUT/pipeline-phases-one-variant.log" || rc=1
  run two-ranks-memcheck "${mpi2[@]}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 ./build-mpi/tests/gpu_test_data_parallel
  run tutorial-08 "${mpi2[@]}" ./build-mpi/examples/08_data_parallel
  run tutorial-15 "${mpi2[@]}" ./build-mpi/examples/15_pipeline_trainer
fi
if is_part quick && [ ${#parts[@]} -gt 0 ]; then
  # The graph copies held to NCCL's own nodes across GPUs, in one device call: the suite on two
  # ranks (the copy-engine trainers check that every memory-operation node ran as the kernel, and
  # every trainer's graphs are copied with NCCL's event records thinned), the copy-engine order
  # test, its must-fail and the all-to-all's, and bench/nccl_graph_launch (the copies' node types
  # and launch times).
  run quick-two-ranks "${mpi2[@]}" ./build-mpi/tests/gpu_test_data_parallel --no-colors=true
  must_fail mem-op-waits-skipped mem_op_waits_skipped '*copy-engine all-gather and all-to-all*' "sums wrong"
  must_fail skip-all-to-all-sum skip_all_to_all_sum '*each all-reduce an all-to-all*' "ERROR: CHECK( same_as_one_all_reduce )"
  run nccl-graph-launch "${mpi2[@]}" ./build-mpi/bench/nccl_graph_launch
  tail -25 "$OUT/nccl-graph-launch.log"
  # The suite again with NCCL's graph-mixing support off: capscope then keeps NCCL's rules for
  # graphs itself (cuda/nccl_graph_mixing.hpp).
  run quick-two-ranks-mixing-off env NCCL_GRAPH_MIXING_SUPPORT=0 "${mpi2[@]}" -x NCCL_GRAPH_MIXING_SUPPORT ./build-mpi/tests/gpu_test_data_parallel --no-colors=true
fi
if is_part mixing && [ ${#parts[@]} -gt 0 ]; then
  # Four variants with NCCL's graph-mixing support off (no event wait or record in NCCL's graphs;
  # docs/multi_gpu.md), on 1, 2 (and 4) GPUs: $OUT/bench-mixing-off.md. Set beside `cuts`'s rows.
  v="data parallel/full_iteration,data parallel/transformer_engine,sharded (kept; copy-engine gathers)/full_iteration"
  v+=",sharded (kept; copy-engine gathers)/transformer_engine"
  rm -f "$OUT/bench-mixing-off.csv"
  for np in 1 2 $([ "$(nvidia-smi -L | wc -l)" -ge 4 ] && echo 4); do
    run "bench-mixing-off-np$np" env NCCL_GRAPH_MIXING_SUPPORT=0 mpirun --allow-run-as-root -np $np -x NCCL_NVLS_ENABLE -x NCCL_GRAPH_MIXING_SUPPORT \
      ./build-mpi/bench/data_parallel --only "$v" --rounds "${CUTS_ROUNDS:-6}" --csv "$OUT/bench-mixing-off.csv"
  done
  python3 bench/data_parallel_table.py "$OUT/bench-mixing-off.csv" >"$OUT/bench-mixing-off.md" && cat "$OUT/bench-mixing-off.md"
fi
if is_part bench; then
  rm -f "$OUT/bench-data-parallel.csv"
  run bench-1gpu mpirun --allow-run-as-root -np 1 -x NCCL_NVLS_ENABLE ./build-mpi/bench/data_parallel --csv "$OUT/bench-data-parallel.csv"
  run bench-2gpu "${mpi2[@]}" ./build-mpi/bench/data_parallel --csv "$OUT/bench-data-parallel.csv"
  [ "$(nvidia-smi -L | wc -l)" -ge 4 ] && run bench-4gpu mpirun --allow-run-as-root -np 4 -x NCCL_NVLS_ENABLE ./build-mpi/bench/data_parallel --csv "$OUT/bench-data-parallel.csv"
  python3 bench/data_parallel_table.py "$OUT/bench-data-parallel.csv" >"$OUT/bench-data-parallel.md" && cat "$OUT/bench-data-parallel.md"
  timeout 240 "${mpi2[@]}" ./build-mpi/bench/pipeline_model >"$OUT/bench-pipeline-model.log" 2>&1
  r=$?; echo "== bench-pipeline-model: exit $r"; grep -E "^\|" "$OUT/bench-pipeline-model.log"
  [ $r -eq 0 ] || rc=1
  for work in ${PIPELINE_WORK:-2000 100}; do
    timeout 240 "${mpi2[@]}" ./build-mpi/bench/pipeline --work "$work" >"$OUT/bench-pipeline-work$work.log" 2>&1
    r=$?; echo "== bench-pipeline --work $work: exit $r"; grep -E "^\||1f1b" "$OUT/bench-pipeline-work$work.log"
    [ $r -eq 0 ] || rc=1
  done
fi
if is_part cuts && [ ${#parts[@]} -gt 0 ]; then
  cuts="data parallel (copy-engine all-to-all)/transformer_engine,data parallel (copy-engine all-to-all)/full_iteration"
  cuts+=",sharded (kept; copy-engine gathers)/transformer_engine,sharded (kept; copy-engine gathers)/full_iteration"
  cuts+=",sharded (kept; all on copy engines)/transformer_engine,sharded (kept; all on copy engines)/full_iteration"
  cuts+=",data parallel (copy-engine all-to-all; memory operations as nodes)/transformer_engine"
  cuts+=",data parallel (copy-engine all-to-all; memory operations as nodes)/full_iteration"
  cuts+=",sharded (kept; copy-engine gathers; memory operations as nodes)/transformer_engine"
  cuts+=",sharded (kept; copy-engine gathers; memory operations as nodes)/full_iteration"
  cuts+=",data parallel/full_iteration,data parallel (event records kept)/full_iteration"
  cuts+=",sharded (kept; copy-engine gathers; event records kept)/full_iteration"
  rm -f "$OUT/bench-cuts.csv"
  for np in 1 2 $([ "$(nvidia-smi -L | wc -l)" -ge 4 ] && echo 4); do
    run "bench-cuts-np$np" mpirun --allow-run-as-root -np $np -x NCCL_NVLS_ENABLE ./build-mpi/bench/data_parallel --only "$cuts" \
      --rounds "${CUTS_ROUNDS:-8}" --csv "$OUT/bench-cuts.csv"
  done
  python3 bench/data_parallel_table.py "$OUT/bench-cuts.csv" >"$OUT/bench-cuts.md" && cat "$OUT/bench-cuts.md"
fi
if is_part launch && [ ${#parts[@]} -gt 0 ]; then
  # Host microseconds per step (the enqueueing call) of one variant, 1 and 2 GPUs, per setting.
  v="${LAUNCH_VARIANT:-sharded/transformer_engine}"
  for setting in none CUDA_DEVICE_MAX_CONNECTIONS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_GRAPH_MIXING_SUPPORT=0 \
                 CUDA_MODULE_LOADING=EAGER NCCL_LAUNCH_MODE=GROUP NCCL_PROTO=Simple; do
    for np in 1 2; do
      extra=(); [ "$setting" = none ] || extra=(-x "${setting%%=*}")
      log="$OUT/launch-$(echo "$setting" | tr -c 'A-Za-z0-9_\n' '-')-np$np.log"
      env ${setting/none/} timeout 240 mpirun --allow-run-as-root -np $np -x NCCL_NVLS_ENABLE "${extra[@]}" ./build-mpi/bench/data_parallel \
        --only "$v" >"$log" 2>&1
      r=$?; echo "== $setting, $np GPU(s): exit $r $(grep -E 'GPU\(s\)' "$log")"
      [ $r -eq 0 ] || rc=1
    done
  done
fi
if is_part profile; then
  # Where the 2-GPU step loses to the 1-GPU one: three variants traced with CUPTI on 1 and 2 GPUs
  # (bench/data_parallel --trace: NCCL time no compute kernel overlaps, time with no kernel
  # running, the host's longest CUDA calls). PROFILE_VARIANTS picks others ("MODE/IMPL,..." as
  # --only takes); PROFILE_CTAS="16 8 4" also times the first variant on 2 GPUs with NCCL held to
  # that many CTAs (NCCL_MAX_CTAS), untraced.
  IFS=, read -ra variants <<<"${PROFILE_VARIANTS:-sharded/transformer_engine,sharded/full_iteration,data parallel/full_iteration}"
  for v in "${variants[@]}"; do
    for np in 1 2; do
      log="$OUT/profile-$(echo "$v" | tr -c 'a-z_\n' '-')-np$np.log"
      timeout 240 mpirun --allow-run-as-root -np $np -x NCCL_NVLS_ENABLE ./build-mpi/bench/data_parallel --only "$v" --trace >"$log" 2>&1
      r=$?; echo "== profile $v, $np GPU(s): exit $r"
      grep -E "GPU\(s\)" "$log"
      [ $r -eq 0 ] || { tail -5 "$log"; rc=1; }
    done
  done
  for ctas in ${PROFILE_CTAS:-}; do
    log="$OUT/profile-ctas-$ctas.log"
    timeout 240 mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE -x NCCL_MAX_CTAS=$ctas -x NCCL_MIN_CTAS=1 ./build-mpi/bench/data_parallel \
      --only "${variants[0]}" >"$log" 2>&1
    r=$?; echo "== ${variants[0]}, 2 GPUs, NCCL_MAX_CTAS=$ctas: exit $r"
    grep -E "GPU\(s\)" "$log"
    [ $r -eq 0 ] || rc=1
  done
fi
if is_part fork; then
  g++ -std=c++20 -O1 -I/usr/local/cuda/include tools/launch_probe/fork_probe.cpp -L/usr/local/cuda/lib64 -lcudart -lnccl -o build-mpi/fork_probe
  for v in clean cuda id; do
    NCCL_DEBUG=INFO timeout 60 ./build-mpi/fork_probe $v >"$OUT/fork-$v.log" 2>&1
    echo "== fork $v: exit $?"; grep -E "fork_probe|rank [01]:|WARN|error" "$OUT/fork-$v.log" | tail -8
  done
fi
echo "multi-gpu-check exit $rc"
exit $rc
