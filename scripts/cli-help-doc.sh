#!/usr/bin/env bash
# Rewrites the --help blocks of docs/cli.md from the built mhar-toy, so that the page says what
# the binary says (run after changing a flag): every ```text block holding a line
# "Usage: build/tools/mhar-toy [SUB] …" becomes the output of `build/tools/mhar-toy [SUB] --help`.
#   usage: scripts/cli-help-doc.sh [path/to/mhar-toy = build/tools/mhar-toy]
set -euo pipefail
cd "$(dirname "$0")/.."
toy=${1:-build/tools/mhar-toy}
[[ -x "$toy" ]] || { echo "cli-help-doc: no $toy (build it first)" >&2; exit 1; }
/usr/bin/python3 - "$toy" docs/cli.md <<'PY'
import re, subprocess, sys
toy, path = sys.argv[1], sys.argv[2]
text = open(path).read()
def regenerate(block):
    m = re.search(r"^Usage: build/tools/mhar-toy (\S+)", block.group(1), re.M)
    if not m:
        return block.group(0)
    sub = [] if m.group(1) == "[OPTIONS]" else [m.group(1)]
    out = subprocess.run([toy, *sub, "--help"], capture_output=True, text=True, check=True).stdout
    out = out.replace(toy, "build/tools/mhar-toy")
    return "```text\n" + out.rstrip("\n") + "\n```"
new = re.sub(r"```text\n(.*?)```", regenerate, text, flags=re.S)
open(path + ".tmp", "w").write(new)
import os; os.replace(path + ".tmp", path)
PY
echo "cli-help-doc: docs/cli.md rewritten from $toy"
