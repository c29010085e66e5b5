#!/usr/bin/env bash
# The CPU reference tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, no
# CUDA). CI runs this after scripts/test.sh; it is limited to the reference (routing, layers,
# AdamW, the model in every mode) because a sanitizer build of the tools takes ~15 minutes on 2
# cores. For everything: `ctest --test-dir build-asan` after building all targets there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMHAR_SANITIZE=ON \
  -DMHAR_CUDA=OFF -DMHAR_DOCS=OFF -DMHAR_WERROR=ON
cmake --build build-asan --parallel "$(nproc)" --target test_reference
cd build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure --parallel "$(nproc)" -R '^reference:'
