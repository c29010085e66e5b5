#!/usr/bin/env bash
# libFuzzer on the safetensors header parser (tests/fuzz/fuzz_safetensors_header.cpp) for a bounded
# time, under ASan + UBSan. Builds with clang++ into build-fuzz/ (the main build is g++'s), seeds
# the corpus with a few valid headers, and fails on any finding: a crash, a leak, undefined
# behaviour, an exception other than our refusal, or an accepted header that breaks the format's
# rules. CI runs it from scripts/sanitize.sh.
#
# usage: scripts/fuzz.sh [SECONDS=60]    (MHAR_FUZZ_SEED fixes libFuzzer's seed; default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus"
io=tools/io
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I "$io" tests/fuzz/fuzz_safetensors_header.cpp "$io/safetensors_header.cpp" \
  "$io/safetensors.cpp" "$io/strict_json.cpp" "$io/file_util.cpp" "$io/half.cpp" \
  -o "$out/fuzz_safetensors_header"
seed() {  # name, data size, header text: one corpus file
  printf "\\x$(printf %02x $(($2 % 256)))\\x$(printf %02x $(($2 / 256)))%s" "$3" > "$out/corpus/$1"
}
seed two 20 '{"__metadata__":{"format":"mhar.checkpoint","step":"3"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F16","shape":[2],"data_offsets":[16,20]}}'
seed scalar 8 '{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}'
seed empty 0 '{"z":{"dtype":"I64","shape":[0,3],"data_offsets":[0,0]},"__metadata__":{}}'
seed bf16 6 '{"h":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}}'
cat > "$out/dict" <<'DICT'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"F64\""
"\"I64\""
"\"BF16\""
"\"F16\""
"18446744073709551615"
"9223372036854775807"
DICT
# -rss_limit_mb: the reader's bound (the file's size + 100 MB) with ASan's overhead on top.
log=$out/fuzz.log
if ! "$out/fuzz_safetensors_header" "$out/corpus" -dict="$out/dict" -seed="${MHAR_FUZZ_SEED:-1}" \
    -max_total_time="$seconds" -max_len=4096 -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/" \
    > "$log" 2>&1; then
  grep -m 3 -E 'breaks|ERROR|SUMMARY' "$log" || true
  tail -n 40 "$log"
  echo "fuzz: libFuzzer found an input the header parser mishandles (above; the input is saved in $out/)" >&2
  exit 1
fi
grep -E '^(Done|stat::(number_of_executed_units|new_units_added|peak_rss_mb))' "$log"
echo "fuzz: libFuzzer ran the header parser for ${seconds} s with no finding"
