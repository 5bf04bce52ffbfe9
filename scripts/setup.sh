#!/bin/bash
# Installs what is missing (Debian packages, as root), then configures and builds taiji
# into ./build. Safe to run again: it only does what is not done yet.
set -euo pipefail
cd "$(dirname "$0")/.."

# procps (pgrep) and iproute2 (ip, tc) are for the launcher and namespace-cluster tests;
# abigail-tools (abidw, abidiff) for the ABI check; the python3-* ones for the Python
# package, its tests and examples (Debian's /usr/bin/python3); libcurl for the etcd store
# backend, and etcd-server, which its tests start on loopback.
packages=(g++ pkg-config meson ninja-build python3 libuv1-dev libspdlog-dev libfmt-dev libssl-dev catch2
  libcurl4-openssl-dev etcd-server
  procps iproute2 abigail-tools
  python3-numpy python3-torch python3-pytest python3-sklearn python3-pip python3-setuptools)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root (apt-get needs it) or install: ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized >/dev/null
fi
ninja -C build >/dev/null
echo "setup: built into $(pwd)/build"
