#!/usr/bin/env bash
# The worst inputs a reader has been given, each through `mhar-toy eval` under /usr/bin/time -v:
# the exit code, the first line of the message, the wall time and the peak memory. The bounds of
# docs/checkpoint-format.md: each refused (exit 2) within 1 s and within the file's size + 100 MB.
#
# Peak memory includes what the binary holds before it reads anything (the shared libraries: CUDA's
# cuBLAS alone is ~200 MB resident), printed first as `--version`'s. cpu_s (user + system) is the
# time to compare with the bound on a loaded machine; wall_s is the one to quote on a quiet one.
#
# usage: worst_refusals.sh MHAR_TOY WORKDIR
set -euo pipefail
toy=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
/usr/bin/python3 - "$work" <<'EOF'
import json, os, struct, sys
work = sys.argv[1]

def write(name, header, data=b""):
    text = header.encode() if isinstance(header, str) else header
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(work, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)

def config(**over):
    c = {"vocab": 256, "d": 8, "L": 1, "n_head": 2, "n_kv_head": 1, "ffn": 8, "T": 8,
         "mode": "mhar", "H": 0, "n_blocks": 2}
    c.update(over)
    return {"format": "mhar.checkpoint", "format_version": "1", "step": "1",
            "config": json.dumps(c)}

# 100,000 nested arrays in place of a tensor entry
write("deep.safetensors", '{"w":' + "[" * 100000 + "]" * 100000 + "}")
# a million tensors of zero size (a 56 MB header, inside the 100 MB limit)
entries = ",".join('"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i
                   for i in range(1000000))
write("keys.safetensors", '{"__metadata__":' + json.dumps(config()) + "," + entries + "}")
# configs far beyond the file: L = 10^7, d = 2147483644
one = '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
write("big-L.safetensors", '{"__metadata__":' + json.dumps(config(L=10**7)) + "," + one + "}",
      b"\0" * 4)
write("big-d.safetensors", '{"__metadata__":' + json.dumps(config(d=2147483644, H=1)) + "," +
      one + "}", b"\0" * 4)
EOF
mkfifo "$work/fifo.safetensors"
measure() {  # label, command…: one line of the table
  local label=$1 rc
  shift
  set +e
  timeout 60 /usr/bin/time -v "$@" > "$work/out" 2> "$work/err"
  rc=$?
  set -e
  local wall user sys rss
  wall=$(grep 'Elapsed (wall clock)' "$work/err" | awk '{print $NF}')
  user=$(grep 'User time' "$work/err" | awk '{print $NF}')
  sys=$(grep 'System time' "$work/err" | awk '{print $NF}')
  rss=$(grep 'Maximum resident set size' "$work/err" | awk '{print $NF}')
  printf '%-26s %-4s %-8s %-6s %-8s %s\n' "$label" "$rc" "$wall" "$(awk "BEGIN{print $user + $sys}")" \
    "$((rss / 1024))" "$(grep -m1 'mhar-toy' "$work/err" | cut -c1-120)"
}
printf '%-26s %-4s %-8s %-6s %-8s %s\n' input exit wall_s cpu_s peak_MB message
measure "(--version)" "$toy" --version
for f in deep keys big-L big-d; do
  measure "eval $f.safetensors" "$toy" eval "$work/$f.safetensors" --data /dev/null
done
measure "eval /dev/zero" "$toy" eval /dev/zero --data /dev/null
measure "eval FIFO" "$toy" eval "$work/fifo.safetensors" --data /dev/null
measure "train --data /dev/zero" "$toy" train --data /dev/zero -o "$work/run-zero"
measure "train --data FIFO" "$toy" train --data "$work/fifo.safetensors" -o "$work/run-fifo"
ls -l "$work"/*.safetensors | awk '{print "file size", $5, $NF}'
