#!/usr/bin/env bash
# scripts/gpu-deps.sh — prepares build-deps/: the Debian packages mhar builds with (Eigen, Catch2,
# CLI11, fmt, nlohmann-json), unpacked into a folder instead of installed. Not Cairo: gpu-check.sh
# builds without figures (-DMHAR_FIGURES=OFF).
#
# The lent GPU machine (see docs/gpu-results.md) cannot reach a package mirror. Run this on a
# machine that can (the development machine), then send build-deps/ along with the working tree
# (~12 MB); scripts/gpu-check.sh uses it when it is present. build-deps/ is ignored by git.
#
#   usage:  scripts/gpu-deps.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# libfmt9: never linked there (gpu-check builds fmt header-only), but fmt's CMake config checks
# that the library file it names exists.
pkgs=(libeigen3-dev catch2 libcli11-dev libfmt-dev libfmt9 nlohmann-json3-dev)
rm -rf build-deps
mkdir -p build-deps/debs build-deps/root
(cd build-deps/debs && apt-get download "${pkgs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
for deb in build-deps/debs/*.deb; do dpkg -x "$deb" build-deps/root; done
rm -rf build-deps/debs build-deps/root/usr/share/doc
echo "gpu-deps: ${#pkgs[@]} packages unpacked into build-deps/root ($(du -sh build-deps | cut -f1))"
