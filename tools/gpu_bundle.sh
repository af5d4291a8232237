#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs a build's GPU checks into one folder that runs on a GPU machine which has a driver and
# NCCL but none of hora's build dependencies (no MPI, Gloo, UCX, hwloc, meson): the binaries, the
# shared libraries they need from this machine (not glibc, libstdc++ or NCCL), horarun, the
# gradient shapes (bench/data), and run.sh: THE device script, the first thing to run on any GPU
# machine. It fits one 5-minute call on a one-GPU machine: every step is bounded by `timeout`,
# the limits add up to at most 280 s, and a deadline clamps them. In priority order:
#   the card (no GPU: exit 77 at once); the gate: kernel, executor and GPU-suite tests at 1 rank;
#   hora-gpu-probe; hora-bench --device cuda allreduce back to back and --blocking 1, 1 KiB to
#   1 GiB (x4), allgather, reducescatter and alltoall from 1 MiB; hora-grads --device cuda
#   (ResNet-50, ViT-B/16); in what time is left, 2 ranks sharing the GPU (one GPU) or the suite
#   and an allreduce sweep at every GPU (more).
# It ends with ONE markdown table, hora against NCCL beside the GPU path's targets, printed and
# written to RESULTS/summary.md; `run.sh --summary RESULTS` writes it again from the JSON there.
# Usage: tools/gpu_bundle.sh BUILD OUT   BUILD configured with -Dnccl=enabled -Dbench=enabled
#        (-Dtests=enabled for the gate; -Dgpu_archs=90 for an H100 or H200), then on the GPU
#        machine: OUT/run.sh [RESULTS]   (default ./gpu-results)
set -eu
build=${1:?usage: tools/gpu_bundle.sh BUILD OUT}
out=${2:?usage: tools/gpu_bundle.sh BUILD OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$build/bench/hora-gpu-probe" ] ||
  { echo "gpu_bundle: $build has no hora-gpu-probe (configure with -Dnccl=enabled -Dbench=enabled)" >&2; exit 2; }
bins=("$build/bench/hora-bench" "$build/bench/hora-grads" "$build/bench/hora-gpu-probe")
# The gate's binaries: run.sh skips, and says so, whichever a build lacks.
for b in tools/hora-info test/unit/test_nccl_device test/unit/test_nccl_executor test/gpu/gpu_collectives; do
  if [ -x "$build/$b" ]; then
    bins+=("$build/$b")
  else
    echo "gpu_bundle: warning: $build has no $b (the gate's tests need -Dtests=enabled)" >&2
  fi
done
# A folder bundled before may hold binaries this build lacks: start afresh.
rm -rf "$out/bin" "$out/lib" "$out/data"
mkdir -p "$out/bin" "$out/lib" "$out/data"
cp "${bins[@]}" "$out/bin/"
cp -P "$build"/lib/libhora.so* "$out/lib/" 2>/dev/null || true
rm -rf "$out"/lib/*.p
cp "$root/tools/horarun" "$out/"
# horarun finds its package beside itself
rm -rf "$out/horarun_lib" && cp -r "$root/tools/horarun_lib" "$out/" && rm -rf "$out/horarun_lib/__pycache__"
cp "$root"/bench/data/*_grads.txt "$out/data/"
# What the dynamic loader finds here for them, less what every machine has or the GPU machine
# brings its own of (the C and C++ runtimes, NCCL: it must match that machine's driver).
for f in "${bins[@]}" "$build/lib/libhora.so"; do ldd "$f"; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|libnccl|libhora)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# THE device script (made by tools/gpu_bundle.sh, which says what it runs), from its folder.
#   run.sh [RESULTS]            every step, logs and JSON under RESULTS (default ./gpu-results),
#                               then the summary table (RESULTS/summary.md); exit 77 without a GPU
#   run.sh --summary RESULTS    the summary table again, from RESULTS' JSON and step list
set -u
here=$(cd "$(dirname "$0")" && pwd)

# The summary: one markdown table of hora against NCCL from the programs' --json files, with the
# GPU path's targets; the steps' exits above it. Python 3's standard library only.
summary() {
  python3 - "$1" <<'PY'
import json, os, re, sys

res = sys.argv[1]
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def load(name):
    try:
        with open(os.path.join(res, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def size_text(b):
    return f"{b // GiB} GiB" if b >= GiB else f"{b // MiB} MiB" if b >= MiB else f"{b // KiB} KiB"


def num(v, digits=1):
    return "n/a" if v is None else f"{v:.{digits}f}"


rows = []  # figure, hora, NCCL, hora vs NCCL, target, met (yes / NO / "" for no target / n/a)


def add(figure, hora, nccl, versus, target, met):
    rows.append((figure, hora, nccl, versus, target, "" if met is None else met))


def verdict(ok):
    return "n/a" if ok is None else "yes" if ok else "NO"


def by_size(doc):
    return {r["size"]: r for r in doc.get("rows", [])} if doc else {}


def timing(row, key):
    t = row.get(key) if row else None
    return t if isinstance(t, dict) else None


# Blocking latency: the median op, hora and NCCL each waited for before the next.
blocking = by_size(load("allreduce-blocking.json"))
for size in (KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB):
    for key, form in (("hora_out_of_place", "out of place"), ("hora_in_place", "in place")):
        h, n = timing(blocking.get(size), key), timing(blocking.get(size), "nccl")
        hu, nu = h and h.get("median_us"), n and n.get("median_us")
        ok = None if hu is None or nu is None else hu <= nu + 10
        add(f"blocking allreduce {size_text(size)}, {form}: median op (us)", num(hu), num(nu),
            "n/a" if ok is None else f"{hu - nu:+.1f} us", "<= NCCL + 10 us", verdict(ok))

# Back to back: -n ops then one wait (hora) or one stream sync (NCCL); time per op, algbw ratio.
b2b = by_size(load("allreduce.json"))
for size in (KiB, MiB, 4 * MiB, 64 * MiB, 256 * MiB, GiB):
    goal = 0.95 if size >= 64 * MiB else 0.8 if size == 4 * MiB else None
    for key, form in (("hora_out_of_place", "out of place"), ("hora_in_place", "in place")):
        h, n = timing(b2b.get(size), key), timing(b2b.get(size), "nccl")
        hb, nb = h and h.get("algbw_gbs"), n and n.get("algbw_gbs")
        r = hb / nb if hb and nb else None
        ok = None if r is None else r >= goal if goal else None
        add(f"back-to-back allreduce {size_text(size)}, {form}: time per op (us)",
            num(h and h.get("time_us")), num(n and n.get("time_us")),
            "n/a" if r is None else f"{r:.2f} x algbw", f">= {goal} x" if goal else "",
            verdict(ok) if goal else None)

for coll in ("allgather", "reducescatter", "alltoall"):
    doc = load(f"{coll}.json")
    for size, row in sorted(by_size(doc).items()):
        if size < MiB:
            continue
        h, n = timing(row, "hora_out_of_place"), timing(row, "nccl")
        hb, nb = h and h.get("algbw_gbs"), n and n.get("algbw_gbs")
        r = hb / nb if hb and nb else None
        add(f"back-to-back {coll} {size_text(size)}: time per op (us)",
            num(h and h.get("time_us")), num(n and n.get("time_us")),
            "n/a" if r is None else f"{r:.2f} x algbw", ">= 0.8 x",
            verdict(None if r is None else r >= 0.8))
    if not doc:
        add(f"back-to-back {coll} from 1 MiB", "n/a", "n/a", "n/a", ">= 0.8 x", "n/a")

grads = load("grads.json")
models = {m["name"]: m for m in grads.get("models", [])} if grads else {}
for name, label in (("resnet50", "ResNet-50"), ("vit_b_16", "ViT-B/16")):
    m = models.get(name)
    h, n = timing(m, "hora"), timing(m, "nccl_per_tensor")
    above = m.get("us_per_tensor_above_nccl_per_tensor") if m else None
    tensors = f" ({m['tensors']} tensors)" if m else ""
    goal = name == "resnet50"
    add(f"{label} step{tensors}, median (ms) vs NCCL per tensor",
        num(h and h.get("median_ms"), 3), num(n and n.get("median_ms"), 3),
        "n/a" if above is None else f"{above:+.2f} us/tensor",
        "<= 5 us/tensor above" if goal else "",
        verdict(None if above is None else above <= 5) if goal else None)

lines = []
steps = os.path.join(res, "steps.tsv")
if os.path.exists(steps):
    lines.append("Steps (exit status, seconds; logs in this folder):")
    lines.append("")
    for line in open(steps):
        name, rc, secs = (line.rstrip("\n").split("\t") + ["", ""])[:3]
        if rc in ("skipped", "absent"):
            lines.append(f"- {name}: {rc}")
            continue
        counts = []  # gtest's closing counts, where the step ran tests
        try:
            log = open(os.path.join(res, name + ".log"), errors="replace").read()
        except OSError:
            log = ""
        for word in ("PASSED", "FAILED", "SKIPPED"):
            m = re.search(r"\[  " + word + r" *\] (\d+) test", log)
            if m:
                counts.append(f"{word.lower()} {m.group(1)}")
        tests = f" ({', '.join(counts)})" if counts else ""
        lines.append(f"- {name}: exit {rc} in {secs} s{tests}")
    lines.append("")
head = ("figure", "hora", "NCCL", "hora vs NCCL", "target", "met")
width = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]


def md(r):
    return "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, width)) + " |"


lines += [md(head), md(["-" * w for w in width])] + [md(r) for r in rows]
judged = [r for r in rows if r[5] in ("yes", "NO")]
lines += ["", f"Targets met: {sum(r[5] == 'yes' for r in judged)} of {len(judged)} measured "
          f"({sum(r[5] == 'n/a' for r in rows)} without figures)."]
text = "\n".join(lines) + "\n"
with open(os.path.join(res, "summary.md"), "w") as f:
    f.write(text)
print(text, end="")
PY
}

if [ "${1:-}" = "--summary" ]; then
  [ -d "${2:-}" ] || { echo "usage: run.sh --summary RESULTS" >&2; exit 2; }
  summary "$2"
  exit $?
fi

res=${1:-gpu-results}
mkdir -p "$res"
res=$(cd "$res" && pwd)
: >"$res/steps.tsv"
: >"$res/run.log"
budget=280           # seconds, every step included: one 5-minute call with room to spare
deadline=$((SECONDS + budget - 5))  # the summary's 5 s come after it
log() { echo "== $*" | tee -a "$res/run.log"; }
# step NAME LIMIT command...: the output in $res/NAME.log, its figures' lines in run.log, a line in
# steps.tsv. LIMIT shrinks to the time left; with under 5 s left the step is skipped.
step() {
  local name=$1 limit=$2 start=$SECONDS left=$((deadline - SECONDS))
  shift 2
  if [ "$left" -lt 5 ]; then
    log "$name: skipped, out of time"
    printf '%s\tskipped\t0\n' "$name" >>"$res/steps.tsv"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  timeout -k 2 "$limit" "$@" >"$res/$name.log" 2>&1
  local rc=$?
  local why=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why=" (timed out at $limit s)"
  log "$name: exit $rc in $((SECONDS - start)) s$why"
  grep -E '^ +[0-9]|^[a-z_0-9]+ +[0-9]+ +[0-9.]+ +hora|^ {20,}[A-Za-z]|^\| |^# [a-z_0-9]+: hora|^\[  (PASSED|FAILED) |^[a-z-]+: ' \
    "$res/$name.log" | tail -n 60 | sed 's/^/   /' >>"$res/run.log"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >>"$res/steps.tsv"
  return 0
}
bin=$here/bin
# A step whose binary this bundle lacks (a build without tests) is listed as absent.
have() {
  [ -x "$bin/$1" ] && return 0
  log "$2: skipped, $1 is not in this bundle"
  printf '%s\tabsent\t0\n' "$2" >>"$res/steps.tsv"
  return 1
}

# 1. The card. No GPU: stop here, as a skipped test does.
command -v nvidia-smi >/dev/null || { log "no GPU: no nvidia-smi here"; exit 77; }
card=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1)
if [ $? -ne 0 ] || [ -z "$card" ]; then
  log "no GPU: nvidia-smi says: ${card:-nothing}"
  exit 77
fi
gpus=$(printf '%s\n' "$card" | wc -l)
log "card (name, driver, compute capability, memory): $card"
nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
[ -n "$nccl" ] || nccl=$(timeout 10 find / -xdev -name 'libnccl.so.2' -print -quit 2>/dev/null)
[ -n "$nccl" ] || { log "no libnccl.so.2 on this machine"; exit 1; }
log "NCCL: $nccl"
export LD_LIBRARY_PATH=$here/lib:$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# 2. The gate: nothing below means much if these fail.
have hora-info hora-info && step hora-info 8 "$bin/hora-info"
have test_nccl_device kernels && step kernels 20 "$bin/test_nccl_device"
have test_nccl_executor executor && step executor 15 "$bin/test_nccl_executor"
have gpu_collectives gpu-suite-1 && step gpu-suite-1 40 "$bin/gpu_collectives" --gtest_filter=-GpuShared.*

# 3. What the GPU path's costs are made of, each alone.
step probe 30 "$bin/hora-gpu-probe" --grads "$here/data/resnet50_grads.txt"

# 4. hora against raw NCCL in the same run (one rank, no launcher: a world of one).
step allreduce 35 "$bin/hora-bench" --device cuda -b 1K -e 1G -f 4 --trials 3 --json "$res/allreduce.json"
# Latency: each op waited for, hora's and NCCL's alike; the sweep above checked the results.
step allreduce-blocking 20 "$bin/hora-bench" --device cuda --blocking 1 -b 1K -e 1G -f 4 -n 100 -c 0 \
  --json "$res/allreduce-blocking.json"
for op in allgather reducescatter alltoall; do
  step "$op" 12 "$bin/hora-bench" --device cuda --op "$op" -b 1M -e 256M -f 16 --trials 3 --json "$res/$op.json"
done
step grads 35 "$bin/hora-grads" --device cuda --model "$here/data/resnet50_grads.txt" \
  --model "$here/data/vit_b_16_grads.txt" --json "$res/grads.json"

# 5. In what time is left. One GPU: 2 ranks sharing it, alone (NCCL refuses them; both must fail
# cleanly, and the failure stops the set, so no other test may follow it). More: every GPU.
if [ "$gpus" -eq 1 ]; then
  have gpu_collectives gpu-shared-2 &&
    step gpu-shared-2 10 python3 "$here/horarun" -np 2 "$bin/gpu_collectives" --gtest_filter=GpuShared.*
else
  have gpu_collectives "gpu-suite-$gpus" &&
    step "gpu-suite-$gpus" 60 python3 "$here/horarun" -np "$gpus" "$bin/gpu_collectives" --gtest_filter=-GpuShared.*
  step "allreduce-$gpus" 60 python3 "$here/horarun" -np "$gpus" "$bin/hora-bench" --device cuda \
    -b 1K -e 1G -f 4 --json "$res/allreduce-$gpus.json"
fi

log "done in $SECONDS s: logs and JSON in $res; record the figures in docs/gpu.md"
echo
summary "$res"
# Exit 1 where a step that ran failed (a test, a wrong value, a timeout).
awk -F'\t' '$2 != "0" && $2 != "skipped" && $2 != "absent" {exit 1}' "$res/steps.tsv"
RUN
chmod +x "$out/run.sh"
du -sh "$out"
