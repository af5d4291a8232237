#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real hora job under horarun whose rank 1 is SIGKILLed mid-run: every survivor gets hora's
# error and exits cleanly (hora_shutdown returns) within --stop-after, horarun exits non-zero
# within 10 s with one line naming the rank, and leaves no rank behind. Limits are a quiet
# machine's, stretched by HORA_TEST_TIME_SCALE.
# Usage: killed_rank.sh HORARUN VICTIM_PROGRAM
set -u
horarun=$1 prog=$2
. "$(dirname "$0")/../common/time_scale.sh"
limit=$(scaled 60) budget=$(scaled 12)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# The argument (which the program ignores) marks this job's processes for the check at the end.
marker="killed-rank-test-$$"
VICTIM=1 timeout "$limit" python3 "$horarun" -np 3 -x HORA_TIMEOUT_S="$(scaled 30)" "$prog" "$marker" > /dev/null 2> "$log"
status=$?
elapsed=$(( $(date +%s) - start ))
fail() { echo "FAIL: $*"; echo "--- horarun stderr:"; cat "$log"; exit 1; }
[ "$status" -ne 0 ] || fail "horarun exited 0"
[ "$status" -ne 124 ] || fail "horarun did not stop within $limit s"
grep -q "horarun: rank 1 was killed by signal 9 (SIGKILL)" "$log" || fail "no line naming rank 1 and SIGKILL"
for r in 0 2; do
  grep -Eq "^\[$r\] rank $r: step [0-9]+: (peer lost|timeout): allreduce 'grad'" "$log" ||
    fail "rank $r reported no error from hora"
  grep -q "^\[$r\] rank $r: hora_shutdown -> success" "$log" || fail "rank $r did not shut down cleanly"
done
# Started from the moment of death (step 20, well under a second in), 10 s is the budget.
[ "$elapsed" -le "$budget" ] || fail "took ${elapsed} s (budget $budget s)"
# horarun has exited; its ranks' last moments (exit handlers, the kernel's teardown) may lag.
for _ in $(seq 1 "$(scaled 50)"); do
  left=$(pgrep -f -- "$marker" | wc -l)
  [ "$left" -eq 0 ] && break
  sleep 0.1
done
[ "$left" -eq 0 ] || fail "$left processes of $prog are still running"
echo "1 passed, 0 failed"
