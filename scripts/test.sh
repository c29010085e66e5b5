#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: set-up, build, ctest, then a summary of every
# gradient check's worst relative error. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
# The Doxygen docs must build with zero warnings (WARN_AS_ERROR); skipped where doxygen is absent.
if command -v doxygen > /dev/null; then cmake --build build --target docs; fi
cd build
status=0
ctest --output-on-failure --parallel "$(nproc)" || status=$?
log=Testing/Temporary/LastTest.log
if [ -f "$log" ]; then
  # ctest's "100% tests passed ... out of N" counts its skipped tests in N; say the three apart.
  passed=$(grep -c '^Test Passed\.' "$log" || true)
  skipped=$(grep -c '^Skip regular expression found in output' "$log" || true)
  failed=$(grep -c '^Test Failed\.' "$log" || true)
  echo
  echo "tests: $passed passed, $skipped skipped (no GPU; listed above as \"did not run\"), $failed failed"
  n=$(grep -c '^gradcheck ' "$log" || true)
  worst=$(grep '^gradcheck ' "$log" | sed -E 's/.*worst relative error ([^ ]+).*/\1/' | sort -g | tail -1)
  echo
  echo "gradient checks: $n tensors checked by central differences in double; worst relative error $worst"
  echo "(every line: grep '^gradcheck' build/$log)"
  grep '^gradcheck ' "$log" | sed -E 's/^gradcheck (.*): worst relative error ([^ ]+) .* (ok|FAIL)$/  \3  \2  \1/' | sort -t' ' -k5
fi
exit $status
