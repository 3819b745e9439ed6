set -u
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
( [ -f build-mpi/build.ninja ] || meson setup build-mpi --buildtype=release -Dtools=false >/dev/null ) && \
ninja -C build-mpi tests/gpu_test_data_parallel bench/pipeline_model > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
M="mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE"
SECONDS=0
timeout 200 $M ./build-mpi/tests/gpu_test_data_parallel --no-colors=true > $OUT/dp2.log 2>&1; echo "dp2 (all cases) rc $? in ${SECONDS}s"; grep -E "test cases|ERROR" $OUT/dp2.log | head -4
timeout 100 ./build-mpi/tests/gpu_test_data_parallel --no-colors=true > $OUT/dp1.log 2>&1; echo "one rank rc $?"; grep -E "test cases|ERROR|pipeline needs" $OUT/dp1.log | head -4
timeout 200 $M ./build-mpi/bench/pipeline_model --hidden 256 --seq 64 --batch 2 > $OUT/bench-pipeline-model-small.log 2>&1; echo "bench small rc $?"; tail -12 $OUT/bench-pipeline-model-small.log
