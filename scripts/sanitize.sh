#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, no CUDA).
# The lab smoke tests are left out: they run the same mhar-toy code paths as the cli: tests, and
# under the sanitizers they take minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMHAR_SANITIZE=ON \
  -DMHAR_CUDA=OFF -DMHAR_DOCS=OFF -DMHAR_WERROR=ON
cmake --build build-asan --parallel "$(nproc)"
cd build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure --parallel "$(nproc)" -E '^lab:' 
