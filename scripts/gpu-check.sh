#!/usr/bin/env bash
# scripts/gpu-check.sh — the one prepared script for a session with a GPU.
#
# Configures a fresh build with CUDA on for one architecture (default 90: H100/H200), builds
# mhar-toy and the two test programs that touch the GPU, then, most important first:
#   1. ctest -R '^cuda:'            every kernel and version against the reference, and the whole
#                                   training step (loss, every gradient) in every mode; with
#                                   MHAR_CUDA_SYNC=1, so that a fault names its kernel
#   2. mhar-toy bench routing       kernel GB/s and % of copy bandwidth at the tiny and the paper's
#                                   100M shape (fused twice: default and __launch_bounds__(512, 1));
#                                   GPU step time of mhar ÷ residual at both
#   3. mhar-toy bench step          the tiny training step: 2 CPU threads vs the GPU (the 20× target)
#   4. ctest -R 'device cuda matches'
#                                   `mhar-toy train --device cuda` against the CPU, end to end
#   5. mhar-toy check               the same comparisons as 1, as the table users see, and the
#                                   report of docs/gpu-results.md ($OUT/gpu-report.md)
#   6. compute-sanitizer memcheck   the GPU training step in every mode (where the tool works)
# and prints the card, the commit and a summary last.
#
# Time: the whole run keeps inside MHAR_GPU_BUDGET seconds (default 420, so that a device-tool
# command limit of 480 s leaves a minute to bring the logs back): each step's time limit shrinks
# to what is left (less 25 s for the summary), and a step with under 10 s left is skipped and
# says so. Logs: $BUILD-logs/; where $OUT is set (the device tool), they come back as
# $OUT/gpu-check-logs.tar.gz, with the summary as $OUT/summary.txt, also when configure or the
# build fails (the summary then holds the tail of that log).
#
# The GPU machine has no network: when the Debian packages are missing there, it builds against
# build-deps/ (made by scripts/gpu-deps.sh on a machine with a mirror, and sent along); with
# neither, it stops at once and says so. The first screen shows the card, the commit, the CMake
# and nvcc versions and which packages the build uses.
#
#   usage:  scripts/gpu-check.sh [build-dir = build-gpu]
#   env:    MHAR_GPU_ARCH (default 90), JOBS (default nproc), MHAR_GPU_BUDGET (default 420),
#           MHAR_COMMIT (the commit, where the tree came without .git)
#   exit:   0 when every test and check passed and every benchmark ran, 1 otherwise
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD=${1:-build-gpu}
ARCH=${MHAR_GPU_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
BUDGET=${MHAR_GPU_BUDGET:-420}
T0=$(date +%s)
status=0
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
declare -a SUMMARY=()
note() { SUMMARY+=("$1"); }
# The seconds a step may take: WANT, or less when the budget (less 25 s for the summary) is short.
step_limit() {
  local left=$(( BUDGET - ($(date +%s) - T0) - 25 ))
  echo $(( left < $1 ? left : $1 ))
}
# can_run NAME LIMIT: false (and a note) when too little time is left for the step.
can_run() {
  if (( $2 < 10 )); then
    note "$1: SKIPPED, out of time ($(elapsed) of the $BUDGET s budget used)"
    status=1
    return 1
  fi
}

case "$BUILD" in
  build*) ;;
  *) echo "gpu-check: the build directory must be named build* (got '$BUILD')" >&2; exit 2 ;;
esac
LOGS="$BUILD-logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
# Whatever happens, the logs come back through the device tool's $OUT.
pack_logs() {
  if [[ -n "${OUT:-}" && -d "$OUT" && -w "$OUT" ]]; then
    tar czf "$OUT/gpu-check-logs.tar.gz" "$LOGS" 2>/dev/null || true
    [[ -f "$LOGS/summary.txt" ]] && cp "$LOGS/summary.txt" "$OUT/summary.txt"
    [[ -f "$LOGS/gpu-report.md" ]] && cp "$LOGS/gpu-report.md" "$OUT/gpu-report.md"
  fi
}
trap pack_logs EXIT
# stop STAGE LOG: a summary that says where the run stopped, with the log's tail (what a first
# run on an unknown machine most needs back), then exit 1.
stop() {
  {
    echo "== summary [$(elapsed) of the $BUDGET s budget]: STOPPED at $1"
    echo "card:   ${card:-unknown}"
    echo "commit: ${commit:-unknown}"
    echo "cmake:  ${cmake_version:-unknown}"
    echo "nvcc:   ${nvcc_version:-unknown}"
    if [[ -n "${2:-}" && -f "$2" ]]; then
      echo "last 40 lines of $2:"
      tail -40 "$2"
    fi
    echo "exit: 1"
  } | tee "$LOGS/summary.txt"
  exit 1
}

echo "== card"
card=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true)
echo "${card:-nvidia-smi not available}"
echo "== commit"
# The device machine gets a copy of the working tree, perhaps without .git: the caller names the
# commit then (MHAR_COMMIT=$(git rev-parse --short HEAD) in the command it sends).
if git rev-parse --short HEAD >/dev/null 2>&1; then
  commit="$(git rev-parse --short HEAD) ($(git status --porcelain | wc -l) changed or untracked files)"
else
  commit="${MHAR_COMMIT:-unknown} (no git here; as named by MHAR_COMMIT)"
fi
echo "$commit"

echo "== tools"
cmake_version=$(cmake --version 2>/dev/null | head -1)
echo "cmake: ${cmake_version:=none}"
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvcc_version=$("$NVCC" --version 2>/dev/null | grep -i release | sed 's/.*release //')
echo "nvcc:  ${nvcc_version:=none} ($NVCC)"
echo "c++:   $(c++ --version 2>/dev/null | head -1 || echo none)"
[[ "$cmake_version" != none ]] || { echo "gpu-check: no cmake on this machine" >&2; stop "tools: no cmake"; }

# The Debian packages the build needs: carried in build-deps/, or installed here (a machine set
# up by scripts/setup.sh). Neither: stop now, before a configure that would fail on the first.
DEPS=()
if [[ -d build-deps/root/usr ]]; then
  # fmt and Catch2's main from their headers: Debian's built libraries may need a newer glibc and
  # libstdc++ than the GPU machine's image has.
  DEPS=(-DCMAKE_PREFIX_PATH="$PWD/build-deps/root/usr" -DMHAR_HEADER_ONLY_DEPS=ON)
  echo "deps:  build-deps/ (carried Debian packages)"
else
  missing=()
  for h in eigen3/Eigen/Core catch2/catch.hpp CLI/CLI.hpp fmt/format.h nlohmann/json.hpp \
    stb/stb_image_write.h; do
    [[ -f /usr/include/$h ]] || missing+=("$h")
  done
  if (( ${#missing[@]} > 0 )); then
    echo "gpu-check: build-deps/ is missing and this machine lacks ${missing[*]}:" \
      "run scripts/gpu-deps.sh on the development machine and carry build-deps" >&2
    stop "deps: build-deps/ missing (no ${missing[*]} here either)"
  fi
  echo "deps:  this machine's /usr/include (no build-deps/)"
fi

echo "== configure ($BUILD, sm_$ARCH) [$(elapsed)]"
rm -rf "$BUILD"
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
timeout "$(step_limit 120)" cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} ${DEPS[@]+"${DEPS[@]}"} \
  -DCMAKE_BUILD_TYPE=Release -DMHAR_CUDA=ON -DMHAR_CUDA_ARCHITECTURES="$ARCH" -DMHAR_DOCS=OFF \
  -DMHAR_CUDA_EMULATOR=OFF -DMHAR_FIGURES=OFF >"$LOGS/configure.log" 2>&1 \
  || { tail -40 "$LOGS/configure.log"; echo "gpu-check: configure failed" >&2
       stop "configure ($cmake_version)" "$LOGS/configure.log"; }
grep "mhar:" "$LOGS/configure.log" || true

# Only what the steps below run: the CPU-only test programs are CI's. The build may use all the
# time left: nothing after it can run without it.
echo "== build mhar-toy test_cuda test_cuda_verify test_cli [$(elapsed)]"
timeout "$(step_limit "$BUDGET")" cmake --build "$BUILD" --parallel "$JOBS" \
  --target mhar-toy test_cuda test_cuda_verify test_cli >"$LOGS/build.log" 2>&1 \
  || { tail -50 "$LOGS/build.log"; echo "gpu-check: build failed" >&2
       stop "build" "$LOGS/build.log"; }
grep -i "warning" "$LOGS/build.log" | head -20 || true
echo "built in $(elapsed)"
TOY="$BUILD/tools/mhar-toy"

# Local-memory traffic (register spills) in each routing kernel's machine code: ptxas reports
# spills for fused<4> and fused<16> (docs/kernels.md); the count of LDL/STL instructions says
# how many places touch them. Only where cuobjdump is (not on the development machine).
if command -v cuobjdump >/dev/null 2>&1; then
  cuobjdump -sass "$BUILD/cuda/libmhar_cuda.a" >"$LOGS/sass.txt" 2>/dev/null || true
  awk '/Function :/ { name = $NF } /LDL|STL/ && name ~ /routing/ { n[name]++ }
       END { for (k in n) printf "%4d LDL/STL  %s\n", n[k], k }' "$LOGS/sass.txt" \
    | c++filt | sort -k3 >"$LOGS/spills.txt"
  echo "== local loads and stores in the routing kernels' SASS"
  cat "$LOGS/spills.txt"
  note "SASS: $(wc -l <"$LOGS/spills.txt") routing kernels with local loads or stores (see $LOGS/spills.txt)"
fi

run_ctest() {  # label regex limit [VAR=value for the environment of the tests]
  local limit
  limit=$(step_limit "$3")
  can_run "ctest $1" "$limit" || return 0
  echo "== ${4:+$4 }ctest -R '$2' [$(elapsed)]"
  (cd "$BUILD" && env ${4:+"$4"} timeout "$limit" ctest -R "$2" --output-on-failure) \
    >"$LOGS/ctest-$1.log" 2>&1
  local rc=$?
  tail -25 "$LOGS/ctest-$1.log"
  [[ $rc -eq 0 ]] || status=1
  local skipped
  skipped=$(grep -c "(Skipped)" "$LOGS/ctest-$1.log")
  (( skipped == 0 )) || status=1  # on a GPU nothing may skip
  note "ctest $1: $(grep -E 'tests passed|tests failed' "$LOGS/ctest-$1.log" || echo "no summary (rc $rc)"); $skipped skipped"
}

# 1. every kernel against the reference, every launch synchronised and checked, so that a fault
#    inside a kernel is reported under that kernel's name (cuda/device.h, sync_launches)
run_ctest cuda "^cuda:" 240 MHAR_CUDA_SYNC=1

# 2. the routing kernels and the GPU training step at both shapes
limit=$(step_limit 200)
if can_run "bench routing" "$limit"; then
  echo "== mhar-toy bench routing [$(elapsed)]"
  timeout "$limit" "$TOY" bench routing --repeats 10 >"$LOGS/bench.log" 2>&1
  rc=$?
  cat "$LOGS/bench.log"
  [[ $rc -eq 0 ]] || { status=1; note "bench routing FAILED (rc $rc)"; }
fi

# 3. the tiny training step: 2 CPU threads, then the GPU
limit=$(step_limit 120)
if can_run "bench step" "$limit"; then
  echo "== mhar-toy bench step: 2 CPU threads vs the GPU, tiny config [$(elapsed)]"
  timeout "$limit" "$TOY" bench step --device cpu --threads 2 --heads 4 --repeats 3 \
    >"$LOGS/cpu-step.log" 2>&1 || status=1
  timeout "$(step_limit 60)" "$TOY" bench step --device cuda --heads 4 --repeats 10 \
    >"$LOGS/gpu-step.log" 2>&1 || status=1
  cat "$LOGS/cpu-step.log" "$LOGS/gpu-step.log"
  cpu_ms=$(awk '$1 == "mhar" { print $3 }' "$LOGS/cpu-step.log")
  gpu_ms=$(awk '$1 == "mhar" { print $3 }' "$LOGS/gpu-step.log")
  if [[ -n "$cpu_ms" && -n "$gpu_ms" ]]; then
    note "tiny mhar step: CPU (2 threads) $cpu_ms ms, GPU $gpu_ms ms: $(awk -v c="$cpu_ms" -v g="$gpu_ms" 'BEGIN { printf "%.1f", c / g }')× (target ≥ 20×)"
  else
    note "bench step: mhar step CPU ${cpu_ms:-no result}, GPU ${gpu_ms:-no result} (see $LOGS/*-step.log)"
  fi
fi

# 4. mhar-toy train --device cuda against the CPU, end to end
run_ctest cli-gpu "device cuda matches" 120

# 5. the comparison table users see
limit=$(step_limit 150)
if can_run "check" "$limit"; then
  echo "== mhar-toy check [$(elapsed)]"
  timeout "$limit" "$TOY" check --benches none --report "$LOGS/gpu-report.md" >"$LOGS/check.log" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || status=1
  grep -E "FAIL" "$LOGS/check.log" | head -20
  echo "the 8 rows closest to their tolerance (error ÷ tolerance first):"
  awk 'NR > 2 && $(NF-2) + 0 > 0 && $(NF-1) + 0 > 0 { printf "%.3f  %s\n", $(NF-2) / $(NF-1), $0 }' \
    "$LOGS/check.log" | sort -g | tail -8
  note "check: $(grep -E '^[0-9]+ comparisons:' "$LOGS/check.log" | tail -1) (rc $rc); the report to paste: gpu-report.md"
fi

# 6. memcheck (compute-sanitizer, where it works: seen on Firecracker machines, refused on
#    gVisor): the whole training step in every mode touches every kernel and cuBLAS call.
if command -v compute-sanitizer >/dev/null 2>&1; then
  limit=$(step_limit 150)
  if can_run "memcheck" "$limit"; then
    echo "== compute-sanitizer memcheck: the GPU training step in every mode [$(elapsed)]"
    timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$BUILD/tests/cuda/test_cuda" "GPU training step matches*" >"$LOGS/memcheck.log" 2>&1
    rc=$?
    tail -5 "$LOGS/memcheck.log"
    case $rc in
      0) note "memcheck: clean (training step, every mode)" ;;
      124) note "memcheck: timed out after $limit s (not a failure of the code)" ;;
      3) status=1; note "memcheck: ERRORS (see $LOGS/memcheck.log)" ;;
      1) status=1; note "memcheck: no memory errors reported, but test cases failed (see $LOGS/memcheck.log)" ;;
      *) note "memcheck: could not run (rc $rc; see $LOGS/memcheck.log)" ;;
    esac
  fi
else
  note "memcheck: compute-sanitizer not on this machine"
fi

echo
{
  echo "== summary [$(elapsed) of the $BUDGET s budget]"
  echo "card:   ${card:-unknown}"
  echo "commit: $commit"
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  echo
  echo "routing kernels (% copy: target forward ≥ 80, backward ≥ 60; versions naive, fused, fused-lb1 = fused under __launch_bounds__(512, 1), warp):"
  grep -E "^(routing,|copy|forward|backward)" "$LOGS/bench.log" 2>/dev/null || echo "(no bench)"
  echo "GPU training step (target: mhar ≤ 1.15× residual at the paper shape):"
  grep -E "^(GPU training step|residual|attnres|mhar|mhar-warp) " "$LOGS/bench.log" 2>/dev/null \
    || echo "(no bench)"
  echo "exit: $status"
} | tee "$LOGS/summary.txt"
exit $status
