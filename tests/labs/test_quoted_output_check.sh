#!/usr/bin/env bash
# The check of quoted output blocks (run_lab_commands.sh, <!-- lab-output: … -->) can fail: a
# README quoting `bench step` as lab 5 printed it before the tool changed must be refused, and the
# same README quoting today's layout must pass.
#
#   tests/labs/test_quoted_output_check.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/mhar-quoted.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cmd='build/tools/mhar-toy bench step --d 16 --layers 1 --ffn 16 --seq-len 8 --batch 2 --repeats 1 --threads 1'

# write_readme FILE BLOCK: a lab README that runs $cmd and quotes BLOCK as its output.
write_readme() {
  printf '%s\n' '<!-- lab-commands -->' '```sh' "$cmd" '```' '<!-- /lab-commands -->' '' \
    "<!-- lab-output: $cmd -->" '```text' "$2" '```' > "$1"
}

# Lab 5's quote before `bench step` gained its round-by-round and copy-speed lines and its new title.
write_readme "$dir/stale.md" "CPU training step (forward + backward + AdamW), d=64 L=4 T=128 batch=16:
mode          H    step (ms)     tokens/s     ÷ residual
residual      -        877.4         2334         1.000×
attnres       1        743.7         2754         0.848×
mhar          2        657.1         3117         0.749×"

write_readme "$dir/fresh.md" "CPU (1 thread) training step (forward + backward + clipping + AdamW), d=16 L=1 T=8 batch=2, 1 interleaved repeat, median:
mode          H    step (ms)     tokens/s     ÷ residual
residual      -            …            …         1.000×
attnres       1            …            …             …×
mhar          2            …            …             …×
round by round, attnres ÷ residual: median …×, middle half …×–…× (1 round)
round by round, mhar ÷ residual: median …×, middle half …×–…× (1 round)"

echo "=== a stale quote must fail"
if LAB_STEP_DIVISOR=1 bash "$here/run_lab_commands.sh" "$dir/stale.md" "$1" "$2"; then
  echo "FAIL: the stale quote passed"
  exit 1
fi
echo "=== today's layout must pass"
LAB_STEP_DIVISOR=1 bash "$here/run_lab_commands.sh" "$dir/fresh.md" "$1" "$2"
echo "the stale quote was refused and the fresh one passed"
