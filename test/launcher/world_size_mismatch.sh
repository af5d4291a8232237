#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two sources of the world size that disagree (mpirun -np 2 under a stale WORLD_SIZE=3) must fail
# hora_init on every rank with a message naming both, not hang or run with a wrong size.
# Usage: world_size_mismatch.sh MPIEXEC PROGRAM
set -u
mpiexec=$1 prog=$2
. "$(dirname "$0")/../common/time_scale.sh"
out=$(timeout "$(scaled 60)" "$mpiexec" --allow-run-as-root --oversubscribe -np 2 -x WORLD_SIZE=3 "$prog" 2>&1)
status=$?
fail() { echo "FAIL: $*"; echo "--- output:"; echo "$out"; exit 1; }
[ "$status" -ne 0 ] || fail "the job succeeded"
[ "$status" -ne 124 ] || fail "the job hung"
n=$(echo "$out" | grep -c "invalid argument: hora_init: the world formed by mpi has 2 ranks but WORLD_SIZE=3")
[ "$n" -eq 2 ] || fail "expected the message on both ranks, saw it $n times"
echo "1 passed, 0 failed"
