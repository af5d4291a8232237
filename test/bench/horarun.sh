#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora-bench and hora-grads without an MPI launcher: two ranks under horarun (an env:// world).
# The harness then synchronises through hora itself; the tables must hold verified rows (#wrong
# 0) for hora on the gloo plane, the raw Gloo column must run, and the raw MPI one must say why
# it did not. A plane that cannot start (ucx in a build without it) is reported, not fatal.
#   usage: horarun.sh HORA_BENCH HORA_GRADS HORARUN
set -euo pipefail
bench=$1
grads=$2
horarun=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
launch=(/usr/bin/python3 "$horarun" -np 2)

"${launch[@]}" "$bench" -b 4 -e 64K -f 16 -n 2 -w 1 --planes gloo,ucx --json "$tmp/bench.json" \
  > "$tmp/bench.txt" 2>&1 || { cat "$tmp/bench.txt"; exit 1; }
cat "$tmp/bench.txt"
# The text table: rank 0's rows ("[0] " then size count type redop root, then hora out of place:
# time algbw busbw #wrong). One plane ran, so nccl-tests' own layout.
rows=$(grep -E '^\[0\] +[0-9]+ ' "$tmp/bench.txt" | awk '{print $2, $10, $14}')
[ "$(wc -l <<< "$rows")" -eq 4 ] || { echo "FAIL: expected 4 rows, got: $rows"; exit 1; }
if awk '$2 != "0" || $3 != "0" {bad = 1} END {exit !bad}' <<< "$rows"; then
  echo "FAIL: a row with #wrong other than 0: $rows"
  exit 1
fi
grep -q '^\[0\] # Out of bounds values : 0 OK' "$tmp/bench.txt"
grep -q '^\[0\] # raw MPI column skipped: launched by env:// variables' "$tmp/bench.txt"
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 2 and d["wrong"] == 0 and d["plane"] == "gloo", d
assert d["mpi_skipped"] and d["gloo"] is True, d
planes = {p["name"]: p for p in d["planes"]}
assert planes["gloo"]["ran"] is True, planes
# ucx: measured where hora has it, else skipped with hora'"'"'s reason
assert planes["ucx"]["ran"] or planes["ucx"]["skipped"], planes
assert [r["size"] for r in d["rows"]] == [4, 64, 1024, 16384], d["rows"]
for r in d["rows"]:
    g = r["hora_planes"]["gloo"]
    for form in ("out_of_place", "in_place"):
        assert g[form]["wrong"] == 0 and g[form]["time_us"] > 0, (form, r)
    assert r["gloo"]["wrong"] == 0 and r["gloo"]["median_us"] > 0, r
    assert r["mpi"] is None, r
print("ok: hora-bench under horarun, gloo plane verified")
' "$tmp/bench.json"

# --blocking 1: hora gets a median column too.
"${launch[@]}" "$bench" -b 4K -e 4K -n 3 -w 1 --planes gloo --blocking 1 --json "$tmp/blocking.json" \
  > "$tmp/blocking.txt" 2>&1 || { cat "$tmp/blocking.txt"; exit 1; }
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
(r,) = d["rows"]
assert r["hora_out_of_place"]["median_us"] > 0 and r["hora_out_of_place"]["wrong"] == 0, r
print("ok: --blocking 1 reports the median op")
' "$tmp/blocking.json"

cat > "$tmp/tiny_grads.txt" <<'MODEL'
# tiny test model: 3 tensors. One line: name dims
conv.weight 8x3x3x3
conv.bias 8
fc.weight 10x72
MODEL
"${launch[@]}" "$grads" --model "$tmp/tiny_grads.txt" --steps 2 --warmup 0 --latency 10 \
  --planes gloo,ucx --json "$tmp/grads.json" > "$tmp/grads.txt" 2>&1 || { cat "$tmp/grads.txt"; exit 1; }
cat "$tmp/grads.txt"
for variant in "hora gloo (fusion on)" "hora gloo (fusion off)" "Gloo per tensor" "Gloo flat (1 call)"; do
  line=$(grep -v "^\(\[[0-9]*\] \)\?#" "$tmp/grads.txt" | grep -F -- "$variant" || true)  # a table row, not a progress comment
  [ -n "$line" ] && [ "$(awk '{print $NF}' <<< "$line")" = "0" ] ||
    { echo "FAIL: no verified row for '$variant': '$line'"; exit 1; }
done
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 2 and d["plane"] == "gloo" and d["mpi_skipped"], d
(m,) = d["models"]
g = m["hora_planes"]["gloo"]
for v in (g["fusion_on"], g["fusion_off"], m["gloo_per_tensor"], m["gloo_flat"]):
    assert v["wrong"] == 0 and v["median_ms"] > 0 and v["mean_ms"] > 0 and len(v["steps_ms"]) == 2, v
assert m["hora_fusion_on"] == g["fusion_on"] and m["mpi_per_tensor"] is None, m
lat = d["latency"]
assert lat["hora_us"] > 0 and lat["hora_mean_us"] > 0 and lat["gloo_us"] > 0, lat
print("ok: hora-grads under horarun, gloo plane verified")
' "$tmp/grads.json"
