#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: installs missing Debian packages, builds hora in build/, runs the multi-rank C
# example at 4 ranks and the PyTorch examples (Horovod-style and DDP) at 2, then at 2 ranks an
# allreduce bandwidth table (hora against raw MPI, Gloo and memcpy; plotted into
# $builddir/bench/allreduce.png) and the gradient steps of two real models.
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

if [ -f "$builddir/bindings/python/hora/__init__.py" ] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  export PYTHONPATH="$PWD/$builddir/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
  echo
  echo "== PyTorch, 2 ranks under horarun: a Horovod script (import hora.torch as hvd)"
  tools/horarun -np 2 --no-prefix /usr/bin/python3 bindings/python/examples/train_horovod.py --steps 100
  if [ -d "$builddir/bindings/python/hora/distributed" ]; then
    echo
    echo "== PyTorch, 2 ranks under horarun: unmodified DistributedDataParallel on the hora backend"
    tools/horarun -np 2 --no-prefix /usr/bin/python3 bindings/python/examples/ddp.py --backend hora --steps 100
  fi
fi

if [ -x "$builddir/bench/hora-bench" ]; then
  echo
  echo "== hora-bench: allreduce float32 sum, 2 ranks, against raw MPI, Gloo and memcpy"
  # -n 10: a 256 MiB raw MPI_Allreduce takes most of a second here. -w 20: small ops need a
  # warm engine (hora warms at least 2 x -n ops anyway: a name's second op is the cached path).
  mpirun "${HORA_MPIRUN_BENCH_ARGS[@]}" -np 2 "$builddir/bench/hora-bench" --planes mpi \
    -b 4K -e 256M -f 4 -w 20 -n 10 -d float -o sum --plot "$builddir/bench/allreduce.png"
  # Across hosts: 2 network-namespace hosts x 2 ranks on this machine (tools/hora-cluster, root
  # only), env:// ranks, hora on UCX and on Gloo against raw Gloo, blocking ops.
  if tools/hora-cluster --check >/dev/null 2>&1; then
    echo
    echo "== hora-bench across 2 hosts x 2 ranks (network namespaces): hora on UCX and Gloo, raw Gloo"
    tools/hora-cluster --hosts 2 -R 2 "$builddir/bench/hora-bench" --planes ucx,gloo --blocking 1 \
      -b 4 -e 16M -f 16 -w 3 -n 10 --memcpy 0 2>&1 | grep '^\[0\]' | cut -c5-
  fi
  echo
  echo "== hora-grads: gradient steps of ResNet-50 and ViT-B/16 (3 timed per variant), 2 ranks"
  # The workloads are in the repository (bench/data); HORA_GRADS_DATA overrides.
  data=${HORA_GRADS_DATA:-bench/data}
  if [ -f "$data/resnet50_grads.txt" ] && [ -f "$data/vit_b_16_grads.txt" ]; then
    # Few steps: ViT-B/16's 346 MB through one raw MPI_Allreduce takes a second or two here.
    mpirun "${HORA_MPIRUN_BENCH_ARGS[@]}" -np 2 "$builddir/bench/hora-grads" --planes mpi --steps 3 --warmup 1 \
      --model "$data/resnet50_grads.txt" --model "$data/vit_b_16_grads.txt"
  else
    echo "skipped: no resnet50_grads.txt and vit_b_16_grads.txt in $data (set HORA_GRADS_DATA)"
  fi
else
  echo "hora-bench was not built (needs MPI and -Dbench enabled)" >&2
fi
