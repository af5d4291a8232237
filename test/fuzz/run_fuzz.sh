#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fuzzes the control-message decoder with libFuzzer (clang, AddressSanitizer and
# UndefinedBehaviorSanitizer) for a fixed number of executions, starting from the seed corpus in
# test/fuzz/corpus. Exits 77 (meson: skipped) when clang or its fuzzer runtime is missing.
#   test/fuzz/run_fuzz.sh [RUNS] [WORKDIR]       default 200000 runs, a fresh temporary WORKDIR
# Keep what it finds: crash-* files in WORKDIR reproduce with `WORKDIR/fuzz_message FILE`.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runs=${1:-200000}
if [ -n "${2:-}" ]; then
  work=$2
else
  # A fresh directory, removed at the end unless the fuzzer found something in it.
  work=$(mktemp -d /tmp/hora-fuzz-XXXXXX)
  trap 'if ! ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then rm -rf "$work"; fi' EXIT
fi
mkdir -p "$work"
cxx=${HORA_FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run_fuzz.sh: $cxx not found (Debian: clang and libclang-rt-14-dev): skipped" >&2
  exit 77
fi
sources=("$src/lib/core/message.cpp" "$src/lib/base/error.cpp" "$src/lib/base/dtype.cpp")
flags=(-std=c++17 -O1 -g -I"$src/lib" -I"$src/include" -DHORA_INTERNAL_BUILD)
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long){return 0;}' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o "$work/probe" 2>/dev/null; then
  echo "run_fuzz.sh: $cxx has no libFuzzer runtime (Debian: libclang-rt-14-dev): skipped" >&2
  exit 77
fi
"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$src/test/fuzz/fuzz_message.cpp" "${sources[@]}" -o "$work/fuzz_message"
# The corpus is copied: libFuzzer adds what it finds to its first directory.
mkdir -p "$work/corpus"
cp "$src"/test/fuzz/corpus/* "$work/corpus/"
cd "$work"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ./fuzz_message -runs="$runs" -max_len=4096 -rss_limit_mb=1024 -malloc_limit_mb=256 \
  -seed=1 -print_final_stats=1 corpus 2>&1 | tail -25
echo "run_fuzz.sh: $runs runs, no failure"
