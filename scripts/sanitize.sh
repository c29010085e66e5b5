#!/usr/bin/env bash
# The CPU reference tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, no
# CUDA, and no -march: this is also the proof that a build for any x86-64 CPU passes), the file
# readers' mutation test (fuzz:) and a bounded libFuzzer run on the header parser, then every
# mhar-toy subcommand once under the same sanitizers. CI runs this after scripts/test.sh; it leaves
# out the other test programs of the tools (a sanitizer build of all of them takes ~15 minutes on
# 2 cores). For everything: `ctest --test-dir build-asan` after building all targets there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMHAR_SANITIZE=ON \
  -DMHAR_CUDA=OFF -DMHAR_DOCS=OFF -DMHAR_WERROR=ON -DMHAR_CPU_ARCH=
# mhar-toy too (+5 min on 2 cores): the one build here without CUDA, so the tools' code for
# machines with no nvcc compiles under -Werror on every CI run (the main build there has nvcc),
# and every subcommand runs once under the sanitizers below.
# test_fuzz (the seeded mutation test of the file readers) links the same library as mhar-toy, so
# it adds one file to the build.
cmake --build build-asan --parallel "$(nproc)" --target test_reference mhar-toy test_fuzz
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
# fontconfig's caches (the figures' text, through Cairo) are freed by no one at exit.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-suppressions.txt"
(cd build-asan && ctest --output-on-failure --parallel "$(nproc)" -R '^(reference|fuzz):')
# libFuzzer on the header parser, bounded (clang's build, its own folder build-fuzz/).
scripts/fuzz.sh 60

# Every mhar-toy subcommand once, on a model small enough to take seconds under ASan: train,
# resume, sample, eval, heatmap, stream, grad, convert, plot, bench step and routing (check says
# it needs a GPU).
toy=build-asan/tools/mhar-toy
smoke=$(mktemp -d)
trap 'rm -rf "$smoke"' EXIT
tiny=(--d 32 -L 2 --n-head 2 --n-kv-head 1 --ffn 64 -T 32 -B 4 -H 4 --threads 2)
$toy train "${tiny[@]}" --steps 4 --eval-every 2 --eval-batches 2 --ckpt-every 2 \
  --heatmap-every 2 --device cpu -o "$smoke/run" -q
$toy train --resume "$smoke/run" --steps 6 -q
$toy sample "$smoke/run" -n 40 >/dev/null
$toy sample "$smoke/run" -n 40 --no-cache --json >/dev/null
$toy eval "$smoke/run" --max-windows 4 >/dev/null
$toy heatmap "$smoke/run" -B 2 -o "$smoke/heat" >/dev/null
$toy stream "$smoke/run" -B 2 --csv "$smoke/stream.csv" >/dev/null
$toy grad --ckpt "$smoke/run" --precision f32 -o "$smoke/grads.safetensors" >/dev/null
$toy train "${tiny[@]}" --mode residual --steps 2 --eval-every 2 --eval-batches 1 --device cpu \
  -o "$smoke/res" -q
$toy convert "$smoke/res" -o "$smoke/delta" --steps 2 >/dev/null
$toy plot "$smoke/run" "$smoke/res" -o "$smoke/loss" >/dev/null
$toy bench step "${tiny[@]}" --device cpu --repeats 1 >/dev/null
$toy bench routing --device cpu -N 3 -P 40 --width 16 --route-heads 4 --repeats 1 --threads 2 \
  >/dev/null
$toy cases --out "$smoke/cases" --set quick --dtype all >/dev/null
mkdir "$smoke/results"
rc=0  # no candidate here: every case is missing, which verify reports as incomplete (exit 1)
$toy verify --cases "$smoke/cases" --results "$smoke/results" --json >/dev/null || rc=$?
[[ $rc -eq 1 ]] || { echo "sanitize: mhar-toy verify with no results exited $rc, not 1" >&2; exit 1; }
rc=0
$toy check >/dev/null 2>&1 || rc=$?
[[ $rc -eq 4 ]] || { echo "sanitize: mhar-toy check without CUDA exited $rc, not 4" >&2; exit 1; }
echo "sanitize: every mhar-toy subcommand ran clean under ASan + UBSan"
