#!/usr/bin/env bash
# Installs the Debian 12 packages mhar builds with; does nothing when they are all present.
# Runs apt-get as root, or through sudo otherwise.
set -euo pipefail
# libcairo2-dev and fonts-dejavu-core draw the figures; poppler-utils (pdftotext) reads the PDFs
# back in the figure tests. python3-numpy and python3-torch run the Python harness and the PyTorch
# twin under Debian's /usr/bin/python3; libopenblas0-pthread gives that torch a fast BLAS (without
# it, Debian's torch falls back to the reference BLAS). python3-pytest runs the py: tests;
# python3-venv and python3-setuptools install python/ into a venv (docs/pytorch.md). clang brings
# libFuzzer, which scripts/fuzz.sh runs on the header parser (CI, through scripts/sanitize.sh).
pkgs=(cmake ninja-build g++ pkg-config libeigen3-dev libcli11-dev libfmt-dev catch2
      nlohmann-json3-dev libcairo2-dev fonts-dejavu-core poppler-utils doxygen graphviz
      python3 python3-numpy python3-torch libopenblas0-pthread python3-pytest python3-venv
      python3-setuptools clang)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
