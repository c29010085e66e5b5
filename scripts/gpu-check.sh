#!/usr/bin/env bash
# scripts/gpu-check.sh — the one prepared script for a session with a GPU.
#
# Configures a fresh build with CUDA on for one architecture (default 90: H100/H200), builds the
# CUDA tests and the routing benchmark, runs `ctest -R ^cuda:`, times every routing kernel
# version at a tiny shape and at the paper's 100M shape (L = 12 → up to N = 25 sources, d = 512,
# H = 4, P = 16384), and prints the card, the commit and a summary table last. Every step has
# its own time limit; the whole run stays under 8 minutes on a 16-core machine.
#
#   usage:  scripts/gpu-check.sh [build-dir = build-gpu]
#   env:    MHAR_GPU_ARCH (default 90), JOBS (default nproc)
#   exit:   0 when the tests pass and every benchmark ran, 1 otherwise
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD=${1:-build-gpu}
ARCH=${MHAR_GPU_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
T0=$(date +%s)
status=0
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }

case "$BUILD" in
  build*) ;;
  *) echo "gpu-check: the build directory must be named build* (got '$BUILD')" >&2; exit 2 ;;
esac

echo "== card"
card=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true)
echo "${card:-nvidia-smi not available}"
echo "== commit"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no git)")
dirty=$(git status --porcelain 2>/dev/null | wc -l || echo 0)
echo "$commit ($dirty changed or untracked files)"

echo "== configure ($BUILD, sm_$ARCH) [$(elapsed)]"
rm -rf "$BUILD"
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
timeout 120 cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=Release -DMHAR_CUDA=ON \
  -DMHAR_CUDA_ARCHITECTURES="$ARCH" -DMHAR_TOOLS=OFF -DMHAR_DOCS=OFF >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; echo "gpu-check: configure failed" >&2; exit 1; }
grep "mhar:" "$BUILD.configure.log" || true

echo "== build [$(elapsed)]"
timeout 300 cmake --build "$BUILD" --parallel "$JOBS" --target test_cuda bench_routing_main \
  >"$BUILD.build.log" 2>&1 \
  || { tail -50 "$BUILD.build.log"; echo "gpu-check: build failed" >&2; exit 1; }
grep -i "warning" "$BUILD.build.log" | head -20 || true

echo "== ctest -R ^cuda: [$(elapsed)]"
set +e
(cd "$BUILD" && timeout 180 ctest -R "^cuda:" --output-on-failure) | tee "$BUILD.ctest.log"
ctest_rc=${PIPESTATUS[0]}
set -e
[[ $ctest_rc -eq 0 ]] || status=1
# The per-case error lines (check ... worst relative error ...) of the comparison tests.
(cd "$BUILD" && timeout 120 tests/cuda/test_cuda "[gpu]" -s 2>/dev/null | grep "^check " | sort -t" " -k12,12 -g | tail -5) || true

echo "== routing benchmark [$(elapsed)]"
TABLE="$BUILD.bench.md"
: >"$TABLE"
bench() {  # N P d H repeats
  local out
  if out=$(timeout 90 "$BUILD/cuda/bench_routing_main" "$@" 2>&1); then
    echo "$out"
    echo "$out" | grep '^| [0-9]' >>"$TABLE"
  else
    echo "$out"
    echo "gpu-check: bench_routing_main $* failed" >&2
    status=1
  fi
}
bench 5 4096 128 4 20     # tiny
bench 9 4096 128 4 20
bench 13 16384 512 4 10   # the paper's 100M model: L = 12, mid-depth site
bench 25 16384 512 4 10   # … the final site, N = 2L + 1

echo
echo "== summary [$(elapsed)]"
echo "card:   ${card:-unknown}"
echo "commit: $commit"
echo "ctest:  $(grep -E 'tests passed|tests failed' "$BUILD.ctest.log" || echo 'no summary')"
echo
echo "| N | P | d | H | op | version | ms | MB | GB/s | % copy |"
echo "|---|---|---|---|---|---|---|---|---|---|"
cat "$TABLE"
exit $status
