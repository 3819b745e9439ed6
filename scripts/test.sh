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
