#!/usr/bin/env bash
# scripts/kernel-resources.sh — what ptxas gives each CUDA kernel: registers, shared memory,
# stack frame and spills, per architecture. Needs nvcc only (no GPU): the static half of a
# kernel's cost, to read before a GPU session measures the other half.
#
#   usage:  scripts/kernel-resources.sh [arch = 90] [-DNAME=value ...] [file.cu ...]
#           (default: every cuda/*.cu and cuda/bench/*.cu; -D flags go to nvcc, e.g.
#           -DMHAR_FUSED4_ONE_BLOCK=0 for a build without the __launch_bounds__(512, 1) fused
#           kernels)
#   prints: one line per kernel: registers, static shared bytes, stack, spill stores/loads, name
#   exit:   0, or 1 when nvcc is missing or a file does not compile
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ARCH=${1:-90}
shift || true
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x "$NVCC" ]] || { echo "kernel-resources: no nvcc (set CUDACXX)" >&2; exit 1; }
defines=()
files=()
for a in "$@"; do
  case "$a" in
    -D*) defines+=("$a") ;;
    *) files+=("$a") ;;
  esac
done
if [[ ${#files[@]} -eq 0 ]]; then files=(cuda/*.cu cuda/bench/*.cu); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-5s %6s %6s %6s %6s  %s\n' "regs" "smem" "stack" "st" "ld" "kernel (sm_$ARCH; bytes)"
for f in "${files[@]}"; do
  # The flags of the project's build (cuda/CMakeLists.txt): C++17, -O3, the repository root.
  "$NVCC" -I. -O3 -DNDEBUG ${defines[@]+"${defines[@]}"} -std=c++17 -gencode "arch=compute_$ARCH,code=sm_$ARCH" \
    -Xptxas -v -c "$f" -o "$tmp/k.o" >"$tmp/log" 2>&1 \
    || { cat "$tmp/log" >&2; echo "kernel-resources: $f does not compile" >&2; exit 1; }
  # ptxas prints per kernel: "Compiling entry function 'NAME'", "N bytes stack frame, N bytes
  # spill stores, N bytes spill loads", "Used N registers, ... N bytes smem, ...".
  awk '
    /Compiling entry function/ { name = $0; sub(/.*function ./, "", name); sub(/. for .*/, "", name) }
    /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
    /Used [0-9]+ registers/ {
      match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      printf "%-5s %6s %6s %6s %6s  %s\n", regs, smem, stack, st, ld, name
    }' "$tmp/log" | c++filt | sed -E 's/mhar::cuda::(routing_detail::)?\(anonymous namespace\):://; s/\(.*//'
done
