#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A bad command line: a nonzero exit and one message (from rank 0) that says what was wrong.
#   usage: bad_args.sh HORA_BENCH HORA_GRADS -- LAUNCHER...
set -uo pipefail
bench=$1
grads=$2
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_error MESSAGE COMMAND...: COMMAND exits nonzero and prints MESSAGE exactly once.
expect_error() {
  local message=$1
  shift
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  local count
  count=$(grep -cF -- "$message" <<< "$out")
  if [ "$rc" -eq 0 ] || [ "$count" -ne 1 ]; then
    echo "FAIL: exit $rc, '$message' seen $count times; output:"
    echo "$out"
    failures=$((failures + 1))
  else
    echo "ok: exit $rc: $(grep -F -- "$message" <<< "$out")"
  fi
}

# Under the launcher (2 ranks): rank 0 alone says it, once.
expect_error "bad value for --op: 'gather': expected a reduction" "$@" "$bench" --op gather
expect_error "-r 2 is not a rank" "$@" "$bench" --op broadcast -r 2
# The rest of the command-line checks run in one process (a world of one): the same parser, a
# quarter of the time of a launch.
expect_error "unknown option --bogus" "$bench" --bogus 1
expect_error "-n needs a value" "$bench" -n
expect_error "bad value for -b: 'lots'" "$bench" -b lots
expect_error "bad value for --trials: '0'" "$bench" --trials 0
expect_error "need 1 <= -b <= -e" "$bench" -b 64K -e 4K
expect_error "unknown -d float8" "$bench" -d float8
expect_error "-o avg needs a floating-point -d" "$bench" -d int32 -o avg
expect_error "unknown --device tpu" "$bench" --device tpu
expect_error "'gather': not a collective" "$bench" gather
expect_error "bad value for --coll: 'sum': not a collective" "$bench" --coll sum
expect_error "bad value for -a: 'x': expected an integer" "$bench" -a x
expect_error "unknown plane 'nccl'" "$bench" --planes gloo,nccl
expect_error "plane 'gloo' given twice" "$grads" --planes gloo,gloo
# Without a GPU (or without NCCL in the build), --device cuda says which.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -eq 0 ]; then
  expect_error "--device cuda: " "$bench" --device cuda
fi
expect_error "cannot write $tmp/none/x.json" "$bench" --json "$tmp/none/x.json"

printf "# a model\nconv.weight\n" > "$tmp/broken_grads.txt"
expect_error "cannot read $tmp/missing.txt" "$grads" --model "$tmp/missing.txt"
expect_error "broken_grads.txt:2: expected 'name dims'" "$grads" --model "$tmp/broken_grads.txt"
expect_error "bad value for --steps: '0'" "$grads" --steps 0

# -n beyond the response cache runs, verified, but the header says what the column then times.
out=$(HORA_CACHE_CAPACITY=4 "$@" -x HORA_CACHE_CAPACITY "$bench" -b 4 -e 4 -n 6 -w 1 --gloo 0 2>&1)
if [ $? -ne 0 ] || ! grep -qF "# note: -n 6 names more ops than the response cache holds (HORA_CACHE_CAPACITY=4)" <<< "$out"; then
  echo "FAIL: -n 6 with HORA_CACHE_CAPACITY=4 ran without the note, or failed:"
  echo "$out"
  failures=$((failures + 1))
elif HORA_CACHE_CAPACITY=4 "$@" -x HORA_CACHE_CAPACITY "$bench" -b 4 -e 4 -n 4 -w 1 --gloo 0 2>&1 | grep -q "# note: -n"; then
  echo "FAIL: -n 4 with HORA_CACHE_CAPACITY=4 has the note"
  failures=$((failures + 1))
else
  echo "ok: -n past HORA_CACHE_CAPACITY noted"
fi

# nccl-tests' command lines: the collective by name (positional, nccl-tests' spelling), --op as the
# reduction, -z, -c COUNT; -a, -G, -t and -g are taken and noted, not applied.
out=$("$@" "$bench" reduce_scatter_perf -b 4 -e 4 -n 2 -w 1 --op max -z 1 -c 3 -a 1 -G 0 -t 1 -g 1 \
      --gloo 0 2>&1)
if [ $? -ne 0 ] || ! grep -qF "# hora-bench: reducescatter, 2 ranks, float, redop max" <<< "$out" ||
   ! grep -qF "(--blocking 1)" <<< "$out" || ! grep -qF "check on" <<< "$out" ||
   [ "$(grep -c '^# note: -[aGtg] ' <<< "$out")" -ne 4 ]; then
  echo "FAIL: an nccl-tests command line:"
  echo "$out"
  failures=$((failures + 1))
else
  echo "ok: reduce_scatter_perf --op max -z 1 -c 3 -a 1 -G 0 -t 1 -g 1"
fi
out=$("$bench" --op allgather -b 4 -e 4 -n 1 -w 0 -c 0 --gloo 0 2>&1)
if ! grep -qF "# hora-bench: allgather, 1 ranks, float, redop none, 4 B .. 4 B x2, 1 iters, 0 warm-up, 1 trial, check off" <<< "$out"; then
  echo "FAIL: --op allgather (the old spelling) with -c 0"
  failures=$((failures + 1))
else
  echo "ok: --op allgather, -c 0"
fi

# --help is not an error. (Read whole: grep -q stops reading at the first match, and the
# launcher, its output cut off, aborts the job on SIGPIPE.)
if ! help=$("$@" "$bench" --help) || ! grep -q "usage: mpirun -np N hora-bench" <<<"$help"; then
  echo "FAIL: hora-bench --help"
  failures=$((failures + 1))
fi
exit $((failures > 0))
