#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The unit tests and a selection of 2-rank tests under a sanitizer, in a build tree of its own:
#   tools/sanitize.sh asan  [meson test args]   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   tools/sanitize.sh tsan  [meson test args]   ThreadSanitizer (build-tsan/)
# HORA_ASAN_BUILDDIR / HORA_TSAN_BUILDDIR name other trees. Without test arguments each runs its
# selection below (docs/testing.md says what each covers and why); with them, those tests. Only the
# targets the chosen tests run are built. Any report fails the test that made it. Suppressions
# (tools/sanitizers/) cover only third-party libraries that are not instrumented.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kind=${1:-}
shift || true
supp=$(pwd)/tools/sanitizers
case "$kind" in
  asan)
    builddir=${HORA_ASAN_BUILDDIR:-build-asan}
    # -O1, as AddressSanitizer's documentation advises: a third of -O2's compile time with the
    # UBSan checks (the build was 7 of CI's 27 minutes at -O2 -g).
    options=(-Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1)
    export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
    ;;
  tsan)
    builddir=${HORA_TSAN_BUILDDIR:-build-tsan}
    # No UCX: its memory hooks (ucm patches mmap and friends in every loaded library when it is
    # loaded) crash ThreadSanitizer's runtime at start, in every process that links libhora.
    options=(-Db_sanitize=thread -Db_lundef=false -Doptimization=2 -Ducx=disabled)
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
    ;;
  *)
    echo "usage: tools/sanitize.sh asan|tsan [meson test arguments]" >&2
    exit 2
    ;;
esac

start=$SECONDS
tools/setup.sh
# No benchmarks, CUDA kernels or Python extensions (Python is not built with the sanitizer
# runtime): they add build time and no test here. -g1: line tables, all a report's stack needs
# (file:line of every frame), without the full debug info that doubles the compile time.
options+=(-Ddebug=false -Dc_args=-g1 -Dcpp_args=-g1 -Db_ndebug=false
          -Dbench=disabled -Dnccl=disabled -Dpython=disabled)
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" "${options[@]}" >/dev/null
else
  meson setup "$builddir" "${options[@]}" >/dev/null
fi

if [ $# -eq 0 ]; then
  # The selection: names below that this build registered (no Gloo: no gloo tests).
  # Both: every single-process unit test (leaks checked under ASan).
  # Both: every multi-process test body at 2 ranks under mpiexec (shared-memory data path, MPI
  #   for what shm does not carry; TSan: not allreduce), and the stall report at 2 ranks (MPI
  #   negotiation).
  # Both: Gloo's data plane (mpiexec, HORA_CPU_BACKEND=gloo, shm off) and the env:// bootstrap
  #   with its TCP store (horarun), MPI's data path for fused allreduces (shm off), the engine
  #   thread running every cycle (caller cycles off).
  # ASan: also every body on Gloo, MPI's path for each op that has a noshm case, and the
  #   shared-memory copy variants (CMA single copy, non-temporal stores): the code that moves
  #   bytes, where an overrun would be.
  # TSan: also the soak (three threads per rank issuing random collectives: the race finder), and
  #   faults_abort (a thread interrupting a set's planes while its cycle waits).
  #   test_kernels starts no thread (and is the slowest test under TSan): ASan runs it; nor does
  #   the allreduce body, beyond the engine's and the callers' that every other body has.
  bodies=(basic allreduce broadcast allgather many_tensors errors threads shutdown alltoall
          reducescatter barrier grouped process_sets join autoname zero_size set_shutdown shm
          caller_cycles)
  want=()
  for b in "${bodies[@]}"; do
    # TSan: allreduce's body is 25 s of reductions on threads every other body also meets.
    [ "$kind" = tsan ] && [ "$b" = allreduce ] && continue
    want+=("mp_${b}_np2")
  done
  # Both: a restart round and survivors re-initialising after a lost peer (horarun's agents).
  want+=(mp_stall_noshm_np2 mp_caller_cycles_off_np2 mp_many_tensors_noshm_np2
         mp_process_sets_horarun_gloo_np2 mp_many_tensors_mpi_gloo_np2
         elastic_restart elastic_elastic)
  if [ "$kind" = asan ]; then
    for b in "${bodies[@]}"; do want+=("mp_${b}_mpi_gloo_np2"); done
    want+=(mp_allreduce_noshm_np2 mp_grouped_noshm_np2 mp_join_noshm_np2 mp_shm_noshm_np2
           mp_allreduce_cma_np2 mp_allreduce_stream_np2)
  else
    want+=(mp_threads_mpi_gloo_np2 mp_set_shutdown_mpi_gloo_np2 mp_join_mpi_gloo_np2
           mp_soak_noshm_np2 faults_abort)
  fi
  registered=$(meson test -C "$builddir" --list 2>/dev/null | sed -n 's/^hora:[a-z]* \/ //p')
  mapfile -t selected < <(
    { grep -x -E 'test_[a-z0-9_]+' <<< "$registered" | { [ "$kind" = tsan ] && grep -v -x test_kernels || cat; }
      printf '%s\n' "${want[@]}" | grep -x -F -f <(echo "$registered"); } | sort -u)
  set -- "${selected[@]}"
fi

# Build only what the chosen tests run (meson's per-test dependencies): no tools, examples or
# tests outside the selection.
mapfile -t targets < <(meson introspect --tests --targets "$builddir" | /usr/bin/python3 -c '
import json, os, sys
builddir, names = sys.argv[1], set(sys.argv[2:])
info = json.load(sys.stdin)
files = {t["id"]: t["filename"] for t in info["targets"]}
picked = [t for t in info["tests"] if t["name"] in names or not names]
out = {os.path.relpath(f, os.path.abspath(builddir))
       for t in picked for d in t["depends"] for f in files.get(d, [])}
print("\n".join(sorted(out)))
' "$builddir" $(printf '%s\n' "$@" | grep -v '^-' || true))
ninja -C "$builddir" -j "${HORA_BUILD_JOBS:-2}" "${targets[@]}"
# Wall seconds of the two phases, for tools/run_tests.sh's summary.
phases=$builddir/meson-logs/phases.txt
echo "build $((SECONDS - start))" > "$phases"
start=$SECONDS
trap 'echo "test $((SECONDS - start))" >> "$phases"' EXIT

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
  # The two runs go at once: the unit tests are single processes (test_kernels, one thread, is
  # most of their time) and the multi-process ones run one at a time, so together they keep both
  # cores busy. The unit run's output follows the other's.
  rc=0
  unit_pid=
  unit_out=$builddir/meson-logs/unit-output.txt
  if [ ${#unit[@]} -gt 0 ]; then
    meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
      --timeout-multiplier "$HORA_TEST_TIME_SCALE" --logbase testlog-unit "${unit[@]}" \
      > "$unit_out" 2>&1 &
    unit_pid=$!
  fi
  if [ ${#multi[@]} -gt 0 ]; then
    ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
      meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 \
      --timeout-multiplier "$HORA_TEST_TIME_SCALE" --logbase testlog-multi "${multi[@]}" || rc=$?
  fi
  if [ -n "$unit_pid" ]; then
    wait "$unit_pid" || rc=$?
    cat "$unit_out"
  fi
  exit $rc
fi
meson test -C "$builddir" --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier "$HORA_TEST_TIME_SCALE" "$@"
