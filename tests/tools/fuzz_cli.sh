#!/usr/bin/env bash
# The mutants test_fuzz writes (MHAR_FUZZ_DUMP=DIR) through a mhar-toy binary, old or new, and the
# count of each outcome: exit 0, exit 2 with a clean message (naming the file, no library text),
# exit 2 unclean, another exit code, a crash (a signal), or a hang (over 10 s).
#
# usage: fuzz_cli.sh MHAR_TOY DUMP_DIR [N=all]
#   DUMP_DIR/checkpoint/*.safetensors go through `eval`; DUMP_DIR/optimizer/*.safetensors through
#   `train --resume` of a run at step 7 of test_fuzz's tiny model (made here by MHAR_TOY, so an
#   old binary reads a run of its own) whose optimizer.safetensors is the mutant; and
#   DUMP_DIR/verify/*.safetensors through `verify` against the first case of
#   `cases --set quick --dtype f32 --seed 1` (test_fuzz's).
set -uo pipefail
toy=$1 dump=$2 n=${3:-0}
data=$(dirname "$0")/../../data/tinyshakespeare.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

classify() {  # exit status, output, file
  local rc=$1 out=$2 file=$3
  if [ "$rc" -eq 124 ]; then echo hang
  elif [ "$rc" -gt 128 ]; then echo "crash(signal $((rc - 128)))"
  elif [ "$rc" -eq 0 ]; then echo "exit 0"
  elif [ "$rc" -eq 2 ] && [[ $out == *"$file"* ]] && [[ $out != *json.exception* ]]; then
    echo "exit 2, clean"
  elif [ "$rc" -eq 2 ]; then echo "exit 2, unclean message"
  else echo "exit $rc"
  fi
}

run_one() {  # kind, file: the outcome
  local kind=$1 f=$2 out rc target
  if [ "$kind" = optimizer ]; then
    target=$work/run-mutant/optimizer.safetensors
    rm -rf "$work/run-mutant"
    cp -r "$work/run" "$work/run-mutant"
    cp "$f" "$target"
    out=$(timeout 10 "$toy" train --resume "$work/run-mutant" --steps 8 -q 2>&1)
    rc=$?
  elif [ "$kind" = verify ]; then
    target=$work/results/$case_file
    cp "$f" "$target"
    out=$(timeout 10 "$toy" verify --cases "$work/cases" --results "$work/results" 2>&1)
    rc=$?
    # verify reports a file it refuses as a FAIL row naming it (exit 1): a clean refusal.
    if [ "$rc" -eq 1 ] && [[ $out == *"(file)"* ]]; then rc=2; fi
  else
    target=$f
    out=$(timeout 10 "$toy" eval --data "$data" --max-windows 2 "$f" 2>&1)
    rc=$?
  fi
  classify "$rc" "$out" "$target"
}

count() {  # kind
  local files=("$dump/$1"/*.safetensors)
  [ "$n" -gt 0 ] && files=("${files[@]:0:$n}")
  for f in "${files[@]}"; do run_one "$1" "$f"; done | sort | uniq -c | sed "s/^/$1: /"
}

count checkpoint
# test_fuzz's tiny model (tiny_config: mhar, d 8, L 1), trained to its step-7 checkpoint.
"$toy" train --mode mhar --d 8 --layers 1 --n-head 2 --n-kv-head 1 --ffn 8 --seq-len 8 --batch 2 \
  --steps 7 --ckpt-every 7 --eval-every 7 --eval-batches 1 --threads 1 --device cpu \
  --data "$data" --out "$work/run" -q > /dev/null 2>&1
count optimizer
"$toy" cases --out "$work/cases" --set quick --dtype f32 --seed 1 >/dev/null
case_file=$(/usr/bin/python3 - "$work/cases/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["cases"] = m["cases"][:1]
json.dump(m, open(sys.argv[1], "w"))
print(m["cases"][0]["file"])
EOF
)
mkdir -p "$work/results"
count verify
