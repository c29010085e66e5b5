#!/usr/bin/env bash
# Smoke test of one course lab: runs the commands of tutorial/<lab>/README.md exactly as written,
# only with fewer steps, so the README and what the tools do cannot drift apart.
#
#   tests/labs/run_lab_commands.sh README SOURCE_DIR BUILD_DIR
#
# The README marks what to run with HTML comments (invisible on GitHub and in Doxygen):
#   <!-- lab-commands -->              … fenced sh blocks …  <!-- /lab-commands -->
#       run as one bash script (set -euo pipefail); must exit 0
#   <!-- lab-commands gpu -->          … <!-- /lab-commands -->
#       each line on its own; exit 0 (ran on a GPU) or 4 (no GPU here) are both accepted
#   <!-- lab-commands expect-fail -->  … <!-- /lab-commands -->
#       each line on its own; must exit non-zero (lab 4's untouched skeleton)
#   <!-- lab-expect: PATH … -->
#       files (globs allowed) that must exist once every block has run
#   <!-- lab-output: COMMAND -->       directly above a fenced block of output quoted in the text
#       once every block has run, COMMAND (steps reduced as below) runs again and the quoted
#       block must have the shape of what it prints today (tests/labs/output_shapes.pl: headers,
#       labels and fields per line, not the noisy digits), so a quote cannot go stale
# Commands run from a fresh temporary directory holding `data` → SOURCE_DIR/data and
# `build` → BUILD_DIR, so `build/tools/mhar-toy … --data data/…` works as printed in the lab.
# Fewer steps: every `--steps N`, `--heatmap-every N`, `--eval-every N`, `--ckpt-every N` and
# `--repeats N` becomes ceil(N / LAB_STEP_DIVISOR) (default 100), which keeps their order (a
# resume to 500 after 300 still trains further). OMP_NUM_THREADS defaults to 1: ctest runs the
# labs side by side.
# LAB_STEP_DIVISOR=1 LAB_DIR=DIR runs a lab at full size in DIR and keeps it (to time a lab).
# MHAR_LAB_FIGURES=0 (a build without figures): a lab that plots or expects a figure file exits
# 77, which ctest reports as skipped.
set -euo pipefail
readme=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") src=$(cd "$2" && pwd) build=$(cd "$3" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
if [ "${MHAR_LAB_FIGURES:-1}" = 0 ] &&
  grep -qE '^<!-- lab-expect: .*\.(png|svg|pdf)|mhar-toy plot ' "$readme"; then
  echo "skipped: this lab draws figures, and this build has none (Cairo not found or MHAR_FIGURES=OFF)"
  exit 77
fi
divisor=${LAB_STEP_DIVISOR:-100}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [ -n "${LAB_DIR:-}" ]; then
  mkdir -p "$LAB_DIR"
  work=$(cd "$LAB_DIR" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/mhar-lab.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
ln -sfn "$src/data" "$work/data"
ln -sfn "$build" "$work/build"
cd "$work"

# Replaces every step count N by ceil(N / divisor).
fewer_steps() {
  perl -pe 's/(--(?:steps|heatmap-every|eval-every|ckpt-every|repeats)[ =])(\d+)/$1 . int(($2 + '"$divisor"' - 1) \/ '"$divisor"')/ge'
}

# extract KIND: prints the fenced-block lines of every `<!-- lab-commands KIND -->` region.
extract() {
  awk -v want="$1" '
    /^<!-- lab-commands( [a-z-]+)? -->$/ {
      kind = $0; sub(/^<!-- lab-commands ?/, "", kind); sub(/ ?-->$/, "", kind)
      inside = (kind == want); next }
    /^<!-- \/lab-commands -->$/ { inside = 0; fence = 0; next }
    inside && /^```/ { fence = !fence; next }
    inside && fence { print }
  ' "$readme" | fewer_steps
}

ran=0
script=$(extract "")
if [ -n "$script" ]; then
  printf '%s\n' "--- commands (steps ÷ $divisor):" "$script" "---"
  bash -euo pipefail -c "$script"
  ran=1
fi

while IFS= read -r line; do
  [ -z "$line" ] && continue
  echo "--- GPU command (exit 0 or 4 accepted): $line"
  code=0
  bash -c "$line" || code=$?
  if [ "$code" -ne 0 ] && [ "$code" -ne 4 ]; then
    echo "FAIL: exit $code (expected 0 on a GPU, 4 without one)"
    exit 1
  fi
  echo "exit $code"
  ran=1
done < <(extract gpu)

while IFS= read -r line; do
  [ -z "$line" ] && continue
  echo "--- command that must fail: $line"
  if bash -c "$line"; then
    echo "FAIL: exited 0, expected a failure"
    exit 1
  fi
  ran=1
done < <(extract expect-fail)

if [ "$ran" -eq 0 ]; then
  echo "FAIL: $readme has no <!-- lab-commands --> block"
  exit 1
fi

missing=0
# Word splitting is intended: a lab-expect line lists patterns separated by spaces.
# shellcheck disable=SC2013
for pattern in $(sed -n 's/^<!-- lab-expect: \(.*\) -->$/\1/p' "$readme"); do
  if ! compgen -G "$pattern" > /dev/null; then
    echo "FAIL: expected file missing: $pattern"
    missing=1
  fi
done
[ "$missing" -eq 0 ] && echo "lab commands ran; expected files present"

# Quoted output blocks: <n>.cmd holds the command, <n>.quoted the block (its indent removed).
quotes="$work/.lab-quotes"
rm -rf "$quotes" && mkdir "$quotes"
perl -ne '
  BEGIN { $n = 0; $state = 0 }
  if ($state == 0 && /^\s*<!-- lab-output: (.*) -->\s*$/) { $n++; $state = 1;
    open(C, ">", "'"$quotes"'/$n.cmd"); print C "$1\n"; close(C); next }
  if ($state == 1) { die "lab-output marker $n: no fenced block right below it\n" unless /^(\s*)```/;
    $indent = $1; $state = 2; open(Q, ">", "'"$quotes"'/$n.quoted"); next }
  if ($state == 2) { if (/^\s*```\s*$/) { close(Q); $state = 0; next } s/^\Q$indent\E//; print Q }
' "$readme"
for cmd_file in "$quotes"/*.cmd; do
  [ -e "$cmd_file" ] || break
  cmd=$(fewer_steps < "$cmd_file")
  echo "--- quoted output of: $cmd"
  bash -c "$cmd" > "${cmd_file%.cmd}.actual" 2>&1 || true
  if ! perl "$here/output_shapes.pl" "${cmd_file%.cmd}.quoted" "${cmd_file%.cmd}.actual"; then
    echo "FAIL: the block quoted under <!-- lab-output: $(cat "$cmd_file") --> is stale"
    missing=1
  fi
done
rm -rf "$quotes"
[ "$missing" -eq 0 ] && echo "quoted output blocks match what their commands print"
exit "$missing"
