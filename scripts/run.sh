#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: set-up, build, then train a tiny MHAR model on
# tiny-Shakespeare (CPU) and write its routing heatmaps. Extra arguments go to `mhar-toy train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target mhar-toy --parallel "$(nproc)"
set -x
build/tools/mhar-toy train --heads 4 "$@"
