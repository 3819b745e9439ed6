#!/usr/bin/env bash
# Installs the Debian packages capscope builds with, if missing (run as root or with sudo).
# The CUDA Toolkit itself is expected at /usr/local/cuda (it is not a Debian package here).
# --tests adds what only the test suites need: PyTorch (CPU), for the peer's check against the
# float64 reference (tests/bench/peer_reference.py); about 800 MB, so the demo goes without it.
set -euo pipefail
packages=(meson ninja-build g++ clang cmake pkg-config python3 libboost-dev doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libyaml-cpp-dev libopenmpi-dev)
case "${1:-}" in
  --tests) packages+=(python3-torch) ;;
  "") ;;
  *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
