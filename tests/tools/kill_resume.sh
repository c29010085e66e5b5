#!/usr/bin/env bash
# A tiny run with a checkpoint every step, killed with SIGKILL at random moments (seeded), resumed
# after each kill, must end bit for bit equal to the uninterrupted run: the same checkpoint and
# optimizer state (sha256) and the same losses, with no temporary file left behind
# (docs/checkpoint-format.md, "A run directory after a kill").
#
# usage: kill_resume.sh MHAR_TOY DATA WORKDIR [KILLS=24] [SEED=36]
set -euo pipefail
toy=$1 data=$2 work=$3 want_kills=${4:-24} seed=${5:-36}
RANDOM=$seed
rm -rf "$work"
mkdir -p "$work"
run=(--data "$data" --d 16 --layers 1 --n-head 2 --n-kv-head 1 --ffn 16 --seq-len 16 --batch 2
     --steps 60 --eval-every 8 --eval-batches 1 --ckpt-every 1 --heatmap-every 0 --format svg
     --threads 1 --device cpu -q)

# 1. The uninterrupted run, and how long it takes (the kills fall anywhere inside that span).
t0=$(date +%s%N)
"$toy" train "${run[@]}" -o "$work/whole"
span_ms=$(( ($(date +%s%N) - t0) / 1000000 + 1 ))
# The start-up of a launch (what a resume of a finished run does: lock, config, checkpoint).
t0=$(date +%s%N)
"$toy" train --resume "$work/whole" -q 2>/dev/null
start_ms=$(( ($(date +%s%N) - t0) / 1000000 + 1 ))

# 2. The same run, killed and resumed until it has been killed want_kills times, then finished.
dir=$work/killed
kills=0 resumes=0 launches=0
launch() {  # a run directory without config.json (killed before it was written) starts afresh
  if [ -f "$dir/config.json" ]; then
    resumes=$((resumes + 1))
    "$toy" train --resume "$dir" -q 2>/dev/null &
  else
    "$toy" train "${run[@]}" -o "$dir" &
  fi
  launches=$((launches + 1))
}
while [ "$kills" -lt "$want_kills" ]; do
  if [ "$launches" -gt $((want_kills * 4)) ]; then
    echo "FAIL: only $kills kills landed in $launches launches" >&2
    exit 1
  fi
  launch
  pid=$!
  # Uniform in [0, start-up + 2 · steps' time / want_kills): some kills land in the start-up,
  # the rest spread over the steps and their checkpoint writes, about one whole run in all.
  steps_ms=$(( span_ms > start_ms ? span_ms - start_ms : 1 ))
  delay_ms=$(( (RANDOM * 32768 + RANDOM) % (start_ms + 2 * steps_ms / want_kills + 1) ))
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -KILL "$pid" 2>/dev/null || true
  rc=0
  wait "$pid" 2>/dev/null || rc=$?
  if [ "$rc" -eq 137 ]; then kills=$((kills + 1)); fi  # it died by the kill, not before it
done
if [ -f "$dir/config.json" ]; then resumes=$((resumes + 1)); "$toy" train --resume "$dir" -q 2>/dev/null;
else "$toy" train "${run[@]}" -o "$dir"; fi

# 3. The same bits, the same losses, nothing left over.
status=0
for f in checkpoint.safetensors optimizer.safetensors; do
  a=$(sha256sum < "$work/whole/$f" | cut -c1-64)
  b=$(sha256sum < "$dir/$f" | cut -c1-64)
  echo "$f sha256 uninterrupted $a killed+resumed $b"
  [ "$a" = "$b" ] || { echo "FAIL: $f differs" >&2; status=1; }
done
if ! diff <(cut -d, -f1-5 "$work/whole/metrics.csv") <(cut -d, -f1-5 "$dir/metrics.csv") >/dev/null; then
  echo "FAIL: the losses differ (metrics.csv, columns step..grad_norm)" >&2
  status=1
fi
left=$(find "$dir" -name '*.tmp-*' -o -name 'optimizer.next.safetensors' | wc -l)
[ "$left" -eq 0 ] || { echo "FAIL: $left temporary files left in $dir" >&2; status=1; }
echo "kills $kills, resumes $resumes, launches $launches (seed $seed; a whole run ${span_ms} ms," \
     "start-up ${start_ms} ms)"
exit $status
