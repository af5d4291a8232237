#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every test: installs missing Debian packages, builds hora in build/, runs `meson test`, then the
# unit and 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer and under
# ThreadSanitizer (tools/sanitize.sh, in build-asan/ and build-tsan/; HORA_SANITIZERS=0 skips
# them), and ends with one line "N passed, N failed[, N skipped]" over all of it. Exits non-zero
# if any test did not pass.
#
# HORA_TEST_TIME_SCALE (default 1) stretches every time limit in the tests by one factor: meson's
# per-test timeouts, the multi-rank watchdogs, the tests' own deadlines and the HORA_TIMEOUT_S
# they give their jobs. Raise it on a machine that is busy with other work; tools/run_loaded.sh
# runs the suite under load.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
builddir=${HORA_BUILDDIR:-build}
export HORA_TEST_TIME_SCALE=${HORA_TEST_TIME_SCALE:-1}

tools/setup.sh

if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" >/dev/null
fi
ninja -C "$builddir" -j "${HORA_BUILD_JOBS:-2}"

testlog="$builddir/meson-logs/testlog.json"
rm -f "$testlog"
rc=0
meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
  --timeout-multiplier "$HORA_TEST_TIME_SCALE" "$@" || rc=$?

if [ ! -s "$testlog" ]; then
  echo "run_tests.sh: meson test wrote no $testlog (exit status $rc)" >&2
  echo "0 passed, 0 failed"
  exit $(( rc != 0 ? rc : 1 ))
fi
testlogs=("$testlog")
# The sanitizer runs (only for the whole suite, not for a selection of tests).
if [ "${HORA_SANITIZERS:-1}" != 0 ] && [ $# -eq 0 ]; then
  for kind in asan tsan; do
    echo "== tools/sanitize.sh $kind"
    HORA_BUILD_JOBS=${HORA_BUILD_JOBS:-2} tools/sanitize.sh "$kind" || rc=$?
    for log in build-"$kind"/meson-logs/testlog*.json; do
      [ -s "$log" ] && testlogs+=("$log")
    done
  done
fi
# One JSON object per test. EXPECTEDFAIL counts as passed; UNEXPECTEDPASS, TIMEOUT and ERROR as failed.
summary=$(/usr/bin/python3 - "${testlogs[@]}" <<'PY'
import json, sys
passed = failed = skipped = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            result = json.loads(line).get("result")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
print(1 if failed else 0)
PY
)
line=${summary%$'\n'*}
any_failed=${summary##*$'\n'}
echo "$line"
if [ "$any_failed" != 0 ] && [ "$rc" -eq 0 ]; then rc=1; fi
exit "$rc"
