#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs a build's GPU checks into one folder that runs on a GPU machine which has a driver and
# NCCL but none of hora's build dependencies (no MPI, Gloo, UCX, hwloc, meson): the binaries, the
# shared libraries they need from this machine (not glibc, libstdc++ or NCCL), horarun, and
# run.sh, which does what docs/gpu.md asks of a device run without mpirun:
#   kernels and executor tests, the GPU suite at 1 rank and at every GPU through horarun (2
#   ranks sharing the GPU where there is one),
#   hora-bench --device cuda against raw NCCL for every collective, 1 KiB to 1 GiB, and the
#   latency sweep (--blocking 1).
# Usage: tools/gpu_bundle.sh BUILD OUT     e.g. meson setup build-gpu -Dgpu_archs=90 -Dnccl=enabled
#        then, on the GPU machine: OUT/run.sh [RESULTS]   (figures and logs under RESULTS)
set -eu
build=${1:?usage: tools/gpu_bundle.sh BUILD OUT}
out=${2:?usage: tools/gpu_bundle.sh BUILD OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$build/test/gpu/gpu_collectives" ] || { echo "gpu_bundle: $build has no GPU tests (configure with -Dnccl=enabled -Dtests=enabled)" >&2; exit 2; }
mkdir -p "$out/bin" "$out/lib"
bins=("$build/tools/hora-info" "$build/test/unit/test_nccl_device" "$build/test/unit/test_nccl_executor"
      "$build/test/gpu/gpu_collectives" "$build/bench/hora-bench")
cp "${bins[@]}" "$out/bin/"
cp -P "$build"/lib/libhora.so* "$out/lib/" 2>/dev/null || true
rm -rf "$out"/lib/*.p
cp "$root/tools/horarun" "$out/"
# What the dynamic loader finds here for them, less what every machine has or the GPU machine
# brings its own of (the C and C++ runtimes, NCCL: it must match that machine's driver).
for f in "${bins[@]}" "$build/lib/libhora.so"; do ldd "$f"; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|libnccl|libhora)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# The device checks, from gpu_bundle.sh's folder. Results: $1 (default ./gpu-results).
set -u
here=$(cd "$(dirname "$0")" && pwd)
res=${1:-gpu-results}
mkdir -p "$res"
summary=$res/summary.txt
log() { echo "== $*" | tee -a "$summary"; }
step() {  # step NAME SECONDS command...: the log under $res, its tail in the summary
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout -k 5 "$limit" "$@" >"$res/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc in $((SECONDS - start)) s"
  grep -E '^ +[0-9]|means|PASSED|FAILED|SKIPPED \]|error' "$res/$name.log" | tail -n 16 | sed 's/^/   /' | tee -a "$summary"
  return 0
}
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee -a "$summary" ||
  { log "no nvidia-smi: no GPU here"; exit 77; }
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
[ -n "$nccl" ] || nccl=$(find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -1)
[ -n "$nccl" ] || { log "no libnccl.so.2 on this machine"; exit 1; }
log "NCCL: $nccl"
export LD_LIBRARY_PATH=$here/lib:$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$here/bin
step hora-info 60 "$bin/hora-info"
step kernels 300 "$bin/test_nccl_device"
step executor 300 "$bin/test_nccl_executor"
step gpu-suite-1 300 "$bin/gpu_collectives" --gtest_filter=-GpuShared.*
for op in allreduce allgather reducescatter broadcast alltoall; do
  step "bench-$op-1" 300 "$bin/hora-bench" --device cuda --op "$op" -b 1K -e 1G -f 4 --json "$res/$op-1.json"
done
step bench-latency-1 300 "$bin/hora-bench" --device cuda -b 1K -e 1G -f 16 --blocking 1
# At every GPU (2 ranks on one GPU skip); then 2 ranks sharing a GPU, alone: NCCL refuses them,
# and both must fail cleanly (the failure stops the set, so no other test may follow it).
n=$((gpus > 1 ? gpus : 2))
step "gpu-suite-$n" 600 python3 "$here/horarun" -np "$n" "$bin/gpu_collectives" --gtest_filter=-GpuShared.*
step gpu-shared-2 120 python3 "$here/horarun" -np 2 "$bin/gpu_collectives" --gtest_filter=GpuShared.*
if [ "$gpus" -gt 1 ]; then
  for op in allreduce allgather reducescatter; do
    step "bench-$op-$gpus" 600 python3 "$here/horarun" -np "$gpus" "$bin/hora-bench" --device cuda --op "$op" \
      -b 1K -e 1G -f 4 --json "$res/$op-$gpus.json"
  done
fi
log "done: logs and figures in $res; record them in docs/gpu.md"
RUN
chmod +x "$out/run.sh"
du -sh "$out"
