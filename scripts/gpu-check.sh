#!/usr/bin/env bash
# scripts/gpu-check.sh — the one prepared script for a session with a GPU.
#
# Configures a fresh build with CUDA on for one architecture (default 90: H100/H200), builds
# everything but the docs, then:
#   1. ctest -R '^cuda:'            every kernel and version against the reference, and the whole
#                                   training step (loss, every gradient) in every mode
#   2. ctest -R 'device cuda'       `mhar-toy train --device cuda` against the CPU, end to end
#   3. mhar-toy check               the same comparisons as a table
#   4. mhar-toy bench routing       kernel GB/s and % of copy bandwidth at the tiny and the paper's
#                                   100M shape; GPU step time of mhar ÷ residual at both
#   5. mhar-toy bench step          the tiny training step: 2 CPU threads vs the GPU (the 20× target)
#   6. compute-sanitizer memcheck   the GPU training step in every mode (where the tool works)
# and prints the card, the commit and a summary last. Each step has its own time limit; the whole
# run stays under 8 minutes on a 16-core machine.
#
# The GPU machine has no network: when the Debian packages are missing there, it builds against
# build-deps/ (made by scripts/gpu-deps.sh on a machine with a mirror, and sent along).
#
#   usage:  scripts/gpu-check.sh [build-dir = build-gpu]
#   env:    MHAR_GPU_ARCH (default 90), JOBS (default nproc)
#   exit:   0 when every test and check passed and every benchmark ran, 1 otherwise
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD=${1:-build-gpu}
ARCH=${MHAR_GPU_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
T0=$(date +%s)
status=0
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
declare -a SUMMARY=()
note() { SUMMARY+=("$1"); }

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

DEPS=()
if [[ -d build-deps/root/usr ]]; then
  DEPS=(-DCMAKE_PREFIX_PATH="$PWD/build-deps/root/usr")
  export LD_LIBRARY_PATH="$PWD/build-deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== using build-deps/ (carried Debian packages)"
fi
command -v cmake >/dev/null || { echo "gpu-check: no cmake on this machine" >&2; exit 1; }

echo "== configure ($BUILD, sm_$ARCH) [$(elapsed)]"
rm -rf "$BUILD"
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
timeout 120 cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} ${DEPS[@]+"${DEPS[@]}"} \
  -DCMAKE_BUILD_TYPE=Release -DMHAR_CUDA=ON -DMHAR_CUDA_ARCHITECTURES="$ARCH" -DMHAR_DOCS=OFF \
  >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; echo "gpu-check: configure failed" >&2; exit 1; }
grep "mhar:" "$BUILD.configure.log" || true

echo "== build [$(elapsed)]"
timeout 300 cmake --build "$BUILD" --parallel "$JOBS" >"$BUILD.build.log" 2>&1 \
  || { tail -50 "$BUILD.build.log"; echo "gpu-check: build failed" >&2; exit 1; }
grep -i "warning" "$BUILD.build.log" | head -20 || true
TOY="$BUILD/tools/mhar-toy"

run_ctest() {  # label regex limit
  echo "== ctest -R '$2' [$(elapsed)]"
  (cd "$BUILD" && timeout "$3" ctest -R "$2" --output-on-failure) | tee "$BUILD.ctest-$1.log" | tail -25
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] || status=1
  note "ctest $1: $(grep -E 'tests passed|tests failed' "$BUILD.ctest-$1.log" || echo "no summary (rc $rc)")"
}
run_ctest cuda "^cuda:" 240
run_ctest cli-gpu "device cuda" 120

echo "== mhar-toy check [$(elapsed)]"
timeout 150 "$TOY" check >"$BUILD.check.log" 2>&1
rc=$?
[[ $rc -eq 0 ]] || status=1
grep -E "FAIL" "$BUILD.check.log" | head -20
# the 8 rows closest to their tolerance
awk 'NR > 2 && $(NF-2) + 0 > 0 && $(NF-1) + 0 > 0 { printf "%.3f  %s\n", $(NF-2) / $(NF-1), $0 }' \
  "$BUILD.check.log" | sort -g | tail -8
note "check: $(tail -1 "$BUILD.check.log") (rc $rc)"

echo "== mhar-toy bench routing [$(elapsed)]"
if timeout 200 "$TOY" bench routing --repeats 10 >"$BUILD.bench.log" 2>&1; then
  cat "$BUILD.bench.log"
else
  cat "$BUILD.bench.log"; status=1; note "bench routing FAILED"
fi

echo "== mhar-toy bench step: 2 CPU threads vs the GPU, tiny config [$(elapsed)]"
timeout 120 "$TOY" bench step --device cpu --threads 2 --heads 4 --repeats 3 >"$BUILD.cpu-step.log" 2>&1 || status=1
timeout 60 "$TOY" bench step --device cuda --heads 4 --repeats 10 >"$BUILD.gpu-step.log" 2>&1 || status=1
cat "$BUILD.cpu-step.log" "$BUILD.gpu-step.log"
cpu_ms=$(awk '$1 == "mhar" { print $3 }' "$BUILD.cpu-step.log")
gpu_ms=$(awk '$1 == "mhar" { print $3 }' "$BUILD.gpu-step.log")
if [[ -n "$cpu_ms" && -n "$gpu_ms" ]]; then
  note "tiny mhar step: CPU (2 threads) $cpu_ms ms, GPU $gpu_ms ms: $(awk -v c="$cpu_ms" -v g="$gpu_ms" 'BEGIN { printf "%.1f", c / g }')× (target ≥ 20×)"
fi

# 6. memcheck (compute-sanitizer, where it works: seen on Firecracker machines, refused on
#    gVisor): the whole training step in every mode touches every kernel and cuBLAS call.
if command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck: the GPU training step in every mode [$(elapsed)]"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BUILD/tests/cuda/test_cuda" "GPU training step matches*" >"$BUILD.memcheck.log" 2>&1
  rc=$?
  tail -5 "$BUILD.memcheck.log"
  case $rc in
    0) note "memcheck: clean (training step, every mode)" ;;
    124) note "memcheck: timed out after 150 s (not a failure of the code)" ;;
    3) status=1; note "memcheck: ERRORS (see $BUILD.memcheck.log)" ;;
    1) status=1; note "memcheck: no memory errors reported, but test cases failed (see $BUILD.memcheck.log)" ;;
    *) note "memcheck: could not run (rc $rc; see $BUILD.memcheck.log)" ;;
  esac
else
  note "memcheck: compute-sanitizer not on this machine"
fi

echo
echo "== summary [$(elapsed)]"
echo "card:   ${card:-unknown}"
echo "commit: $commit"
for line in "${SUMMARY[@]}"; do echo "$line"; done
echo
echo "routing kernels (% copy: target forward ≥ 80, backward ≥ 60; versions naive, fused, warp):"
grep -E "^(routing,|copy|forward|backward)" "$BUILD.bench.log" || true
echo "GPU training step (target: mhar ≤ 1.15× residual at the paper shape):"
grep -E "^(GPU training step|residual|attnres|mhar|mhar-warp) " "$BUILD.bench.log" || true
exit $status
