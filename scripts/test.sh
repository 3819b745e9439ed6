#!/usr/bin/env bash
# From a fresh Debian machine (with the CUDA Toolkit) to green tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
export PATH="/usr/local/cuda/bin:$PATH"
# Reconfigure a build directory that exists (scripts/demo.sh makes one before the test packages
# are in), so every dependency installed just now is found; the test dependencies are required.
if [ -d build ]; then
  meson setup --reconfigure build -Drequire_test_deps=true
else
  meson setup build --buildtype=debugoptimized -Drequire_test_deps=true
fi
meson compile -C build
meson test -C build --print-errorlogs --num-processes "$(nproc)"

# The host-side library a second time, with clang++ (Debian 12's is 14), in its own build
# directory with CUDA off: the rules, flags, plan, hooks, offload plan, capscope-check and
# tutorial 01, warnings as errors; its unit, cli, compile-fail, examples and headers suites.
if [ -d build-clang ]; then
  meson setup --reconfigure build-clang -Drequire_test_deps=true
else
  CXX=clang++ meson setup build-clang --buildtype=debugoptimized -Dcuda=disabled -Dwerror=true -Drequire_test_deps=true
fi
meson compile -C build-clang
meson test -C build-clang --print-errorlogs --num-processes "$(nproc)" \
  --suite unit --suite cli --suite compile-fail --suite examples --suite headers
