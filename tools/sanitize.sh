#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The unit and multi-process tests under a sanitizer, in a build tree of its own:
#   tools/sanitize.sh asan  [meson test args]   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   tools/sanitize.sh tsan  [meson test args]   ThreadSanitizer (build-tsan/)
# Without test arguments: every unit test, and the multi-process tests at 2 ranks (under mpiexec
# on shared memory and on MPI, and under horarun on Gloo). Any report fails the test that made it.
# Suppressions (tools/sanitizers/) cover only third-party libraries that are not instrumented.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kind=${1:-}
shift || true
supp=$(pwd)/tools/sanitizers
case "$kind" in
  asan)
    builddir=${HORA_ASAN_BUILDDIR:-build-asan}
    options=(-Db_sanitize=address,undefined -Db_lundef=false)
    export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
    ;;
  tsan)
    builddir=${HORA_TSAN_BUILDDIR:-build-tsan}
    options=(-Db_sanitize=thread -Db_lundef=false)
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
    ;;
  *)
    echo "usage: tools/sanitize.sh asan|tsan [meson test arguments]" >&2
    exit 2
    ;;
esac

tools/setup.sh
# No benchmarks, CUDA kernels or Python extensions (Python is not built with the sanitizer
# runtime): they add build time and no test here.
options+=(-Dbuildtype=debugoptimized -Dbench=disabled -Dnccl=disabled -Dpython=disabled)
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" "${options[@]}" >/dev/null
else
  meson setup "$builddir" "${options[@]}" >/dev/null
fi
ninja -C "$builddir" -j "${HORA_BUILD_JOBS:-2}"

if [ $# -eq 0 ]; then
  mapfile -t selected < <(meson test -C "$builddir" --list 2>/dev/null |
    sed -n 's/^hora:\(unit\|multiprocess\|gloo\) \/ //p' |
    grep -E '^test_|_np2$|_noshm_np2$' | grep -v -E '^mp_large')
  # test_kernels starts no thread, so ThreadSanitizer has nothing to find there (and it is the
  # slowest test under it, over two minutes); AddressSanitizer still runs it.
  if [ "$kind" = tsan ]; then
    mapfile -t selected < <(printf '%s\n' "${selected[@]}" | grep -v -x test_kernels)
  fi
  set -- "${selected[@]}"
fi
# Sanitized ranks are about 3x slower: every time limit gets 3x the room, through the one factor
# the tests read (HORA_TEST_TIME_SCALE, on top of the caller's), and so does HORA_TIMEOUT_S where a
# test does not set its own. Each run writes $builddir/meson-logs/testlog*.json (tools/run_tests.sh
# counts them).
rm -f "$builddir"/meson-logs/testlog*.json
HORA_TEST_TIME_SCALE=$(awk -v s="${HORA_TEST_TIME_SCALE:-1}" 'BEGIN { print (s + 0 < 1 ? 1 : s) * 3 }')
export HORA_TEST_TIME_SCALE
export HORA_TIMEOUT_S=$(awk -v s="$HORA_TEST_TIME_SCALE" 'BEGIN { print int(40 * s) }')
if [ "$kind" = asan ]; then
  # Open MPI's plugins are unloaded before LeakSanitizer looks, so their allocations cannot be
  # told from hora's by library name: leaks are checked in the single-process tests only.
  mapfile -t unit < <(printf '%s\n' "$@" | grep -E '^test_' || true)
  mapfile -t multi < <(printf '%s\n' "$@" | grep -v -E '^test_' || true)
  rc=0
  if [ ${#unit[@]} -gt 0 ]; then
    meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
      --timeout-multiplier "$HORA_TEST_TIME_SCALE" --logbase testlog-unit "${unit[@]}" || rc=$?
  fi
  if [ ${#multi[@]} -gt 0 ]; then
    ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
      meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
      --timeout-multiplier "$HORA_TEST_TIME_SCALE" --logbase testlog-multi "${multi[@]}" || rc=$?
  fi
  exit $rc
fi
meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier "$HORA_TEST_TIME_SCALE" "$@"
