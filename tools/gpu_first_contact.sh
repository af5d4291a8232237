#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU path's first run on a machine with NVIDIA GPUs, as one script with a bound on each step,
# writing everything under OUT (default ./gpu-first-contact): what docs/gpu.md asks of the first
# device run. Steps:
#   1. build (build-gpu/, only this GPU's architecture: -Dgpu_archs=<its sm>), hora-info;
#   2. the kernel tests (test_nccl_device) and the GPU suite (test/gpu, 1 and 2 ranks; 2 ranks on
#      one GPU are refused by NCCL, so they skip there);
#   3. hora-bench --device cuda against raw NCCL in the same run, 1 KiB to 1 GiB, allreduce, at
#      1 rank and at every GPU, plus allgather and reducescatter at every GPU;
#   4. the gradient step (hora-grads) at every GPU, if it takes --device cuda.
# Usage: tools/gpu_first_contact.sh [OUT]     (needs nvidia-smi and a driver)
set -u
out=${1:-gpu-first-contact}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }
step() {  # step NAME SECONDS command...
  local name=$1 limit=$2
  shift 2
  log "$name"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc after $((SECONDS - start)) s (log: $out/$name.log)"
  return $rc
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || { log "no nvidia-smi: no GPU here"; exit 77; }
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
log "$gpus GPU(s), compute capability $cc"

source tools/mpirun_flags.sh
step build 900 bash -c "meson setup build-gpu -Dgpu_archs=$cc -Dbench=enabled --wipe >/dev/null 2>&1 || \
  meson setup build-gpu -Dgpu_archs=$cc -Dbench=enabled; ninja -C build-gpu -j\$(nproc)" || exit 1
step hora-info 60 build-gpu/tools/hora-info
step kernels 300 build-gpu/test/unit/test_nccl_device
step executor 300 build-gpu/test/unit/test_nccl_executor
step gpu-suite 600 meson test -C build-gpu --no-rebuild --suite gpu --print-errorlogs

bench=build-gpu/bench/hora-bench
step bench-allreduce-1 600 mpirun "${HORA_MPIRUN_BENCH_ARGS[@]}" -np 1 $bench --device cuda -b 1K -e 1G -f 4 \
  --json "$out/allreduce-1.json"
if [ "$gpus" -gt 1 ]; then
  for op in allreduce allgather reducescatter; do
    step "bench-$op-$gpus" 600 mpirun "${HORA_MPIRUN_BENCH_ARGS[@]}" -np "$gpus" $bench --device cuda --op $op \
      -b 1K -e 1G -f 4 --trials 3 --json "$out/$op-$gpus.json"
  done
  if build-gpu/bench/hora-grads --help 2>&1 | grep -q -- "--device"; then
    step grads 600 mpirun "${HORA_MPIRUN_BENCH_ARGS[@]}" -np "$gpus" build-gpu/bench/hora-grads --device cuda
  fi
fi
log "done: figures in $out/*.json and $out/*.log; record them in docs/gpu.md"
