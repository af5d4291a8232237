#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora's CPU planes across hosts, measured on a cluster of network-namespace hosts on this machine
# (tools/hora-cluster), every comparison in one run of its harness:
#   0. the network's own bound (bench/hora_link.cpp): plain TCP sockets between the same hosts,
#      latency of one and two all-to-all exchanges, each rank's rate, the allreduce bound
#   1. blocking allreduce 4 B .. 64 MiB, hora on UCX and on Gloo against raw Gloo (hora-bench),
#      2 hosts x 1 and 2 hosts x 2 ranks
#   2. hora (UCX, then Gloo) against torch.distributed's own Gloo (bench/torch_gloo.py), same shapes
#   3. links shaped to 1 Gbit/s (tc tbf): 64 MiB allreduce busbw, 2 x 1 and 2 x 2
#   4. ResNet-50 and ViT-B/16 gradient steps across 2 hosts x 2: UCX and Gloo (env:// ranks), then
#      MPI and UCX under mpirun (hora-cluster --mpirun)
#   5. one host under mpirun, 2 and 4 ranks: hora on MPI against hora on UCX (the default under
#      mpirun is MPI; this is what says so)
# Usage: bench/cluster_planes.sh [BUILD_DIR] [OUT_DIR]   (root: namespaces need CAP_NET_ADMIN)
# Each part writes OUT_DIR/NAME.txt; the tables are the lines the tools print for rank 0.
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-/tmp/hora-cluster-planes}
mkdir -p "$out"
cluster=tools/hora-cluster
bench=$build/bench/hora-bench
grads=$build/bench/hora-grads
py=/usr/bin/python3
export PYTHONPATH=$PWD/$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}
export HORA_TIMEOUT_S=${HORA_TIMEOUT_S:-120}

run() {  # NAME COMMAND...: the command's output into OUT_DIR/NAME.txt, its time on the terminal
  local name=$1 t=$SECONDS
  shift
  "$@" >"$out/$name.txt" 2>&1
  echo "$name: exit $?, $((SECONDS - t)) s -> $out/$name.txt"
}

if ! $cluster --check >/dev/null 2>&1; then
  echo "cluster_planes.sh: tools/hora-cluster --check fails here (root and network namespaces needed)" >&2
  exit 77
fi

link=$build/bench/hora-link
for R in 1 2; do
  run "link_2x$R" $cluster --hosts 2 -R $R "$link" --bytes 64M --sizes 4,1M,64M
done
for R in 1 2; do
  run "allreduce_2x$R" $cluster --hosts 2 -R $R "$bench" -b 4 -e 64M -f 16 --blocking 1 \
    --planes ucx,gloo -n 40 -w 5 --memcpy 0 --json "$out/allreduce_2x$R.json"
done
for R in 1 2; do
  for plane in ucx gloo; do
    run "torch_gloo_2x${R}_$plane" $cluster --hosts 2 -R $R $py bench/torch_gloo.py --plane $plane -f 16
  done
done
for R in 1 2; do
  run "shaped_1gbit_2x$R" $cluster --hosts 2 -R $R --rate 1gbit "$bench" -b 64M -e 64M \
    --planes ucx,gloo -n 5 -w 1 --memcpy 0
done
run grads_2x2_env $cluster --hosts 2 -R 2 "$grads" --planes ucx,gloo --steps 10 --warmup 2
run grads_2x2_mpirun $cluster --hosts 2 -R 2 --mpirun "$grads" --planes mpi,ucx --steps 10 --warmup 2
# shellcheck source=tools/mpirun_flags.sh
. tools/mpirun_flags.sh
for np in 2 4; do
  run "mpirun_1host_np$np" mpirun "${HORA_MPIRUN_ARGS[@]}" -np $np \
    -x HORA_SHM=off "$bench" -b 4 -e 64M -f 16 --blocking 1 --planes mpi,ucx -n 40 -w 5 --memcpy 0
done
