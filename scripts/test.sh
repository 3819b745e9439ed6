#!/usr/bin/env bash
# From a fresh Debian machine (with the CUDA Toolkit) to green tests, timed by phase.
#
# Phases: the packages, the g++ build, its suites (unit, compile-fail, then the rest), the clang++
# build and its suites, and last the budget check: the g++ build, the unit and compile-fail phases
# and the total may take at most so many times a reference compile timed in the same run
# (tests/ci_budget.py), so a suite that grows past its share fails here, on any machine, before
# CI's hard limit does. Each
# phase's wall time is printed at the end and kept in build/phase-times.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
times_file=$(mktemp)
phase() { # name, command...: runs it and records its wall time
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  echo "== phase: $name"
  "$@"
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s %d.%d\n' "$name" $(( ms / 1000 )) $(( ms % 1000 / 100 )) >>"$times_file"
}

phase packages scripts/install-deps.sh --tests
started=$(date +%s) # the total leaves the packages out: a fresh machine's downloads are not the tests' time
# CPU CI builds at -O1 without debug information (3x cheaper than -O2 -g to compile); without a
# GPU the GPU tests are built only to check they compile and link (meson.build: gpu_tests).
options=(-Drequire_test_deps=true -Doptimization=1 -Ddebug=false)
# Reconfigure a build directory that exists (scripts/demo.sh makes one before the test packages
# are in), so every dependency installed just now is found; the test dependencies are required.
if [ -d build ]; then
  phase "g++ configure" meson setup --reconfigure build "${options[@]}"
else
  phase "g++ configure" meson setup build "${options[@]}"
fi
phase "g++ build" meson compile -C build
run_suites() { meson test -C "$1" --print-errorlogs --num-processes "$(nproc)" "${@:2}"; }
phase "g++ unit" run_suites build --suite unit
phase "g++ compile-fail" run_suites build --suite compile-fail
phase "g++ other suites" run_suites build --no-suite unit --no-suite compile-fail

# The host-side library a second time, with clang++ (Debian 12's is 14), in its own build
# directory with CUDA off, warnings as errors: everything host-side is built there (capscope-check
# included), and what can differ under clang runs: the rules' diagnostics, every header on its own,
# the unit tests, tutorial 01 and --emit-cpp's files compiled by clang++. (The other CLI tests run
# the same code on the same inputs; the g++ pass runs them.)
if [ -d build-clang ]; then
  phase "clang++ configure" meson setup --reconfigure build-clang "${options[@]}"
else
  phase "clang++ configure" env CXX=clang++ meson setup build-clang -Dcuda=disabled -Dwerror=true "${options[@]}"
fi
phase "clang++ build" meson compile -C build-clang
phase "clang++ suites" run_suites build-clang --suite unit --suite compile-fail --suite examples --suite headers --suite emit-cpp

echo
echo "wall time by phase (s):"
echo "total $(( $(date +%s) - started ))" >>"$times_file"
cp "$times_file" build/phase-times.txt
awk '{ name = $0; sub(/ [^ ]+$/, "", name); printf "  %-22s %7.1f\n", name, $NF }' build/phase-times.txt
python3 tests/ci_budget.py build/phase-times.txt
