#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every test: installs missing Debian packages, builds hora in build/, runs `meson test`, then the
# unit tests and a selection of 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# and under ThreadSanitizer (tools/sanitize.sh, in build-asan/ and build-tsan/; HORA_SANITIZERS=0
# skips them; docs/testing.md says what each covers). It ends with the wall time of each phase,
# tests, passed, failed and seconds per suite of each build, and last one line
# "N passed, N failed[, N skipped]" over all of it. Exits non-zero if any test did not pass.
#
# HORA_TEST_TIME_SCALE (default 1) stretches every time limit in the tests by one factor: meson's
# per-test timeouts, the multi-rank watchdogs, the tests' own deadlines and the HORA_TIMEOUT_S
# they give their jobs. Raise it on a machine that is busy with other work; tools/run_loaded.sh
# runs the suite under load. HORA_BUILDDIR, HORA_ASAN_BUILDDIR and HORA_TSAN_BUILDDIR name the
# build trees; HORA_BUILD_JOBS the compile jobs (2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
builddir=${HORA_BUILDDIR:-build}
export HORA_TEST_TIME_SCALE=${HORA_TEST_TIME_SCALE:-1}
export HORA_BUILD_JOBS=${HORA_BUILD_JOBS:-2}
phases=()  # "NAME SECONDS", in order

t=$SECONDS
tools/setup.sh
phases+=("setup $((SECONDS - t))")

# What the tests leave behind: hora's files in /tmp and /dev/shm that were not there before the
# run (flight recorder files, scratch directories, shared segments) fail it at the end. Tests
# write into their own scratch directories (meson's test setup points HORA_FLIGHT_RECORDER into
# the build tree), and remove them.
# (hora-cluster's lock file stays on purpose: every hora-cluster on the machine locks that file.)
litter() {
  ls -d /tmp/hora-* /dev/shm/hora-* 2>/dev/null | grep -v '^/tmp/hora-cluster\.lock$' | sort || true
}
litter_before=$(litter)

t=$SECONDS
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" >/dev/null
fi
ninja -C "$builddir" -j "$HORA_BUILD_JOBS"
phases+=("main-build $((SECONDS - t))")

rm -rf "$builddir/test-scratch/flight"/*  # the last run's flight recorder files
testlog="$builddir/meson-logs/testlog.json"
rm -f "$testlog"
rc=0
t=$SECONDS
# The 'background' suite (compilers, mostly: the README's install, the torch backend's
# type-check) runs one test at a time beside the rest, whose multi-rank tests spend much of their
# time in timers and waits; given test arguments, meson test's selection alone decides.
bglog="$builddir/meson-logs/testlog-background.json"
rm -f "$bglog"
bg_pid=
select=("$@")
if [ $# -eq 0 ]; then
  meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 1 --suite background \
    --logbase testlog-background --timeout-multiplier "$HORA_TEST_TIME_SCALE" \
    > "$builddir/meson-logs/background.txt" 2>&1 &
  bg_pid=$!
  select=(--no-suite background)
fi
# Two at a time: the tests that may run beside another start first (priority); the others run
# alone, as they say (is_parallel: false).
meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
  --timeout-multiplier "$HORA_TEST_TIME_SCALE" "${select[@]}" || rc=$?
if [ -n "$bg_pid" ]; then
  wait "$bg_pid" || rc=1
  echo "== the background suite (beside the tests above)"
  cat "$builddir/meson-logs/background.txt"
fi
phases+=("main-test $((SECONDS - t))")

if [ ! -s "$testlog" ]; then
  echo "run_tests.sh: meson test wrote no $testlog (exit status $rc)" >&2
  echo "0 passed, 0 failed"
  exit $(( rc != 0 ? rc : 1 ))
fi
testlogs=("main=$testlog")
[ -s "$bglog" ] && testlogs+=("main=$bglog")
# The sanitizer runs (only for the whole suite, not for a selection of tests).
if [ "${HORA_SANITIZERS:-1}" != 0 ] && [ $# -eq 0 ]; then
  for kind in asan tsan; do
    if [ "$kind" = asan ]; then dir=${HORA_ASAN_BUILDDIR:-build-asan}; else dir=${HORA_TSAN_BUILDDIR:-build-tsan}; fi
    echo "== tools/sanitize.sh $kind"
    rm -f "$dir"/meson-logs/phases.txt
    t=$SECONDS
    tools/sanitize.sh "$kind" || rc=$?
    # sanitize.sh writes its phases' wall seconds ("build N", "test N").
    if [ -s "$dir/meson-logs/phases.txt" ]; then
      while read -r name secs; do phases+=("$kind-$name $secs"); done < "$dir/meson-logs/phases.txt"
    else
      phases+=("$kind $((SECONDS - t))")
    fi
    for log in "$dir"/meson-logs/testlog*.json; do
      [ -s "$log" ] && testlogs+=("$kind=$log")
    done
  done
fi
# One JSON object per test. EXPECTEDFAIL counts as passed; UNEXPECTEDPASS, TIMEOUT and ERROR as
# failed. The summary's last line is the totals; other tooling reads it.
/usr/bin/python3 - "${testlogs[@]}" "--" "${phases[@]}" > "$builddir/meson-logs/summary.txt" <<'PY' || rc=$?
import collections, json, sys
args = sys.argv[1:]
logs, phases = args[:args.index("--")], args[args.index("--") + 1:]
suites = collections.OrderedDict()  # (build, suite) -> [tests, passed, failed, skipped, seconds]
passed = failed = skipped = 0
for item in logs:
    build, path = item.split("=", 1)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            test = json.loads(line)
            # "hora:unit / test_dtype"
            suite = test.get("name", "").split(" / ")[0].split(":")[-1] or "?"
            row = suites.setdefault((build, suite), [0, 0, 0, 0, 0.0])
            row[0] += 1
            row[4] += float(test.get("duration") or 0)
            result = test.get("result")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
                row[1] += 1
            elif result == "SKIP":
                skipped += 1
                row[3] += 1
            else:
                failed += 1
                row[2] += 1
print("== Wall time per phase")
total = 0
for p in phases:
    name, secs = p.rsplit(" ", 1)
    total += int(secs)
    print("  %-12s %5d s" % (name, int(secs)))
print("  %-12s %5d s (%d min %02d s)" % ("total", total, total // 60, total % 60))
print("== Tests per suite (seconds: the sum of the tests' durations; two may overlap)")
print("  %-5s %-13s %5s %6s %6s %7s %8s" % ("build", "suite", "tests", "passed", "failed", "skipped", "seconds"))
for (build, suite), (n, ok, bad, skip, secs) in suites.items():
    print("  %-5s %-13s %5d %6d %6d %7d %8.0f" % (build, suite, n, ok, bad, skip, secs))
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
PY
left=$(comm -13 <(echo "$litter_before") <(litter) | sed '/^$/d')
if [ -n "$left" ]; then
  echo "== The tests left these behind (each test writes into a scratch directory of its own and removes it):"
  echo "$left" | sed 's/^/  /'
  rc=1
fi
cat "$builddir/meson-logs/summary.txt"
if [ ! -s "$builddir/meson-logs/summary.txt" ]; then
  echo "0 passed, 0 failed"
  rc=1
fi
exit "$rc"
