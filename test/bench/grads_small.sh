#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora-grads on a five-tensor model written here: one step per variant, every result verified,
# the JSON complete, and with HORA_TIMELINE set, each hora variant traced into its own files.
#   usage: grads_small.sh HORA_GRADS -- LAUNCHER...
set -euo pipefail
grads=$1
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/tiny_grads.txt" <<'MODEL'
# tiny test model: 5 tensors, 955 float32 values. One line: name dims
conv.weight 8x3x3x3
conv.bias 8
fc.weight 10x72
fc.bias 10
scale 1
MODEL
HORA_TIMELINE="$tmp/tl.json" "$@" "$grads" --model "$tmp/tiny_grads.txt" --steps 1 --warmup 0 \
  --latency 10 --json "$tmp/grads.json"
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 2 and d["steps"] == 1, d
(m,) = d["models"]
assert m["name"] == "tiny" and m["tensors"] == 5 and m["elements"] == 955, m
for v in ["hora_fusion_on", "hora_fusion_off", "mpi_per_tensor", "mpi_flat"]:
    assert m[v]["wrong"] == 0 and m[v]["median_ms"] > 0 and len(m[v]["steps_ms"]) == 1, (v, m[v])
assert d["latency"]["hora_us"] > 0 and d["latency"]["mpi_us"] > 0, d["latency"]

# The timelines: fusion on in tl.rank<R>.json, fusion off (one tensor per operation, as
# HORA_FUSION_THRESHOLD=0 runs it) in tl-fusion-off.rank<R>.json; each names all five tensors.
names = {"conv.weight", "conv.bias", "fc.weight", "fc.bias", "scale"}
for r in (0, 1):
    for path, off in ((sys.argv[2] + "/tl.rank%d.json" % r, False),
                      (sys.argv[2] + "/tl-fusion-off.rank%d.json" % r, True)):
        ev = json.load(open(path))
        rows = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
        assert {"grads.tiny." + n for n in names} <= rows, (path, rows)
        ops = [e for e in ev if e.get("name") == "ALLREDUCE" and "tensors" in e.get("args", {})]
        assert ops, path
        if off:
            assert all(e["args"]["tensors"] == 1 for e in ops), (path, ops)
print("ok")
' "$tmp/grads.json" "$tmp"
