#!/usr/bin/env bash
# Configures and builds mhar into build/ (Release, warnings as errors). Extra arguments go to cmake
# configure, e.g. scripts/build.sh -DMHAR_CUDA=OFF. MHAR_CUDA_ARCHITECTURES in the environment
# narrows the CUDA architectures (CI builds one to save time).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-DCMAKE_BUILD_TYPE=Release -DMHAR_WERROR=ON)
if [ -n "${MHAR_CUDA_ARCHITECTURES:-}" ]; then args+=("-DMHAR_CUDA_ARCHITECTURES=${MHAR_CUDA_ARCHITECTURES}"); fi
cmake -S . -B build -G Ninja "${args[@]}" "$@"
cmake --build build --parallel "$(nproc)"
