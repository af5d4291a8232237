#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora-bench --plot writes a PNG (skipped, exit 77, where gnuplot is not installed).
#   usage: plot.sh HORA_BENCH -- LAUNCHER...
set -euo pipefail
bench=$1
shift 2
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "gnuplot not installed (Debian: gnuplot-nox): skipped"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$@" "$bench" --op allgather -b 4 -e 64K -n 2 -w 1 --plot "$tmp/bench.png"
/usr/bin/python3 -c '
import sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
assert len(data) > 1000, len(data)
print("ok: %d bytes of PNG" % len(data))
' "$tmp/bench.png"
