#!/usr/bin/env bash
# From a fresh Debian machine (with the CUDA Toolkit) to green tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
export PATH="/usr/local/cuda/bin:$PATH"
[ -d build ] || meson setup build --buildtype=debugoptimized
meson compile -C build
meson test -C build --print-errorlogs --num-processes "$(nproc)"
