#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test suite on a busy machine: COPIES copies of the main suite (tools/run_tests.sh without the
# sanitizer runs) at once, each in a build tree of its own as two checkouts would be, while HOGS busy
# loops keep the cores busy. A test that passes only on a quiet machine fails here.
#
#   tools/run_loaded.sh [--copies K] [--hogs N] [--rounds R] [meson test arguments]
#
# Defaults: 2 copies, one hog per core, 1 round. Copy 1 builds in $HORA_BUILDDIR (build/), copy k
# in build-loaded-k/. Time limits stay at the quiet machine's (HORA_TEST_TIME_SCALE as the caller
# set it, default 1): the point is that the suite passes under load as it is. Each round prints its
# copies' summaries; the last line, "N passed, N failed", counts every test of every round and copy.
# Exits non-zero if any test failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

copies=2
hogs=$(nproc)
rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --copies) copies=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
for v in "$copies" "$hogs" "$rounds"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "run_loaded.sh: '$v' is not a count" >&2; exit 2; }
done
[ "$copies" -ge 1 ] && [ "$rounds" -ge 1 ] || { echo "run_loaded.sh: need copies and rounds >= 1" >&2; exit 2; }

builddirs=("${HORA_BUILDDIR:-build}")
for ((k = 2; k <= copies; ++k)); do builddirs+=("build-loaded-$k"); done

# Build every tree first, on a quiet machine: the load is for the tests.
tools/setup.sh
for dir in "${builddirs[@]}"; do
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" >/dev/null
  else
    meson setup "$dir" >/dev/null
  fi
  ninja -C "$dir" -j "${HORA_BUILD_JOBS:-2}" >/dev/null
done

hog_pids=()
stop_hogs() {
  if [ ${#hog_pids[@]} -gt 0 ]; then
    kill "${hog_pids[@]}" 2>/dev/null || true
    wait "${hog_pids[@]}" 2>/dev/null || true
  fi
  hog_pids=()
}
trap stop_hogs EXIT INT TERM

logdir=$(mktemp -d /tmp/hora-loaded.XXXXXX)
total_passed=0 total_failed=0 clean_rounds=0
for ((round = 1; round <= rounds; ++round)); do
  for ((h = 0; h < hogs; ++h)); do
    ( while :; do :; done ) &
    hog_pids+=($!)
  done
  start=$(date +%s)
  pids=()
  for ((k = 1; k <= copies; ++k)); do
    HORA_BUILDDIR=${builddirs[k - 1]} HORA_SANITIZERS=0 tools/run_tests.sh "$@" \
      > "$logdir/round$round.copy$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  stop_hogs
  round_failed=0
  for ((k = 1; k <= copies; ++k)); do
    log=$logdir/round$round.copy$k.log
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
    if [ -z "$line" ]; then
      line="0 passed, 1 failed (no summary: see $log)"
    fi
    passed=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    failed=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    round_failed=$((round_failed + failed))
    echo "round $round, copy $k (${builddirs[k - 1]}): $line"
    if [ "$failed" -ne 0 ]; then
      grep -E '^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT|ERROR) ' "$log" | sed 's/^/    /' || true
    fi
  done
  [ "$round_failed" -eq 0 ] && clean_rounds=$((clean_rounds + 1))
  echo "round $round: $(( $(date +%s) - start )) s with $hogs busy loops and $copies copies; logs in $logdir"
done
echo "$clean_rounds of $rounds rounds clean"
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
