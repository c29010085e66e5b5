#!/usr/bin/env bash
# Rewrites the --help blocks of docs/cli.md from the built mhar-toy, so that the page says what
# the binary says (run after changing a flag): every ```text block holding a line
# "Usage: build/tools/mhar-toy [SUB] …" becomes the output of `build/tools/mhar-toy [SUB] --help`.
# With --check it changes nothing: it prints how the page differs from the binary and exits 1
# when it does (the ctest docs:cli-help runs it so).
#   usage: scripts/cli-help-doc.sh [--check] [path/to/mhar-toy = build/tools/mhar-toy] [page]
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; shift; fi
toy=${1:-build/tools/mhar-toy}
page=${2:-docs/cli.md}
[[ -x "$toy" ]] || { echo "cli-help-doc: no $toy (build it first)" >&2; exit 1; }
/usr/bin/python3 - "$toy" "$page" "$check" <<'PY'
import difflib, os, re, subprocess, sys
toy, path, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
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
if check:
    if new == text:
        print(f"cli-help-doc: {path} says what {toy} --help says")
        sys.exit(0)
    sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                               f"{path} (as written)", f"{path} (from --help)"))
    print(f"cli-help-doc: {path} differs from {toy} --help; run scripts/cli-help-doc.sh")
    sys.exit(1)
open(path + ".tmp", "w").write(new)
os.replace(path + ".tmp", path)
print(f"cli-help-doc: {path} rewritten from {toy}")
PY
