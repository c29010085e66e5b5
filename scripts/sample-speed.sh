#!/usr/bin/env bash
# scripts/sample-speed.sh — `mhar-toy sample` with and without the decode cache, in alternating
# rounds (docs/decode.md, "Speed"). Alternating matters on a shared machine: a change in load then
# hits both paths, not one.
#
#   usage:  scripts/sample-speed.sh RUN [rounds = 5] [length = 1000]
#           RUN: a run folder (mhar-toy train --out RUN); MHAR_TOY: the binary
#           (default build/tools/mhar-toy)
#   prints: one line per round and path (bytes/s wall, bytes/s CPU, window slides), then the
#           best and the median bytes/s of each path and their ratio (cache ÷ no cache)
#   exit:   0; 1 when a sample fails (its message is shown); 2 without RUN
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[[ $# -ge 1 ]] || { sed -n '6,11p' "$0" >&2; exit 2; }
RUN=$1
ROUNDS=${2:-5}
LENGTH=${3:-1000}
TOY=${MHAR_TOY:-build/tools/mhar-toy}
[[ -x "$TOY" ]] || { echo "sample-speed: no $TOY (build first: scripts/build.sh)" >&2; exit 1; }

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for _ in $(seq "$ROUNDS"); do
  for path in cache no-cache; do
    flag=()
    [[ $path == no-cache ]] && flag=(--no-cache)
    json=$("$TOY" sample "$RUN" --length "$LENGTH" --json "${flag[@]}") ||
      { echo "sample-speed: sample failed" >&2; exit 1; }
    /usr/bin/python3 -c '
import json, sys
j = json.loads(sys.argv[2])
print(sys.argv[1], round(j["bytes_per_s"], 1), round(j["bytes_per_cpu_s"], 1), j["window_slides"])
' "$path" "$json" | tee -a "$rows"
  done
done
/usr/bin/python3 - "$rows" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
speed = {p: [float(r[1]) for r in rows if r[0] == p] for p in ("cache", "no-cache")}
best = {p: max(v) for p, v in speed.items()}
med = {p: statistics.median(v) for p, v in speed.items()}
print(f"best    cache {best['cache']:.0f}  no-cache {best['no-cache']:.1f}  "
      f"ratio {best['cache'] / best['no-cache']:.1f}x")
print(f"median  cache {med['cache']:.0f}  no-cache {med['no-cache']:.1f}  "
      f"ratio {med['cache'] / med['no-cache']:.1f}x")
EOF
