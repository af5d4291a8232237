#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: installs missing Debian packages, builds hora in build/, runs the multi-rank C
# example at 4 ranks, then a short allreduce bandwidth table (hora against raw MPI) at 2 ranks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
builddir=${HORA_BUILDDIR:-build}

tools/setup.sh
# shellcheck source=tools/mpirun_flags.sh
source tools/mpirun_flags.sh

if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" >/dev/null
fi
ninja -C "$builddir" -j "${HORA_BUILD_JOBS:-2}"

echo
echo "== hora-example: 4 ranks under mpirun (MPI bootstrap, MPI data plane)"
mpirun "${HORA_MPIRUN_ARGS[@]}" -np 4 "$builddir/bindings/c/examples/hora-example"
if grep -q "HORA_HAVE_GLOO 1" "$builddir/hora_config.h" 2>/dev/null; then
  echo
  echo "== hora-example: 4 ranks under horarun (env:// bootstrap, Gloo data plane, no MPI)"
  tools/horarun -np 4 --no-prefix "$builddir/bindings/c/examples/hora-example"
fi

if [ -x "$builddir/bench/hora-bench" ]; then
  echo
  echo "== hora-bench: allreduce float32 sum, 2 ranks"
  mpirun "${HORA_MPIRUN_ARGS[@]}" -np 2 "$builddir/bench/hora-bench" \
    -b 4 -e 64M -f 4 -w 5 -n 20 -d float -o sum
else
  echo "hora-bench was not built (needs MPI and -Dbench enabled)" >&2
fi
