#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hora-bench --json: the file parses, holds one row per size with every column, and no value is
# wrong.   usage: json_rows.sh HORA_BENCH -- LAUNCHER...
set -euo pipefail
bench=$1
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$@" "$bench" -b 4 -e 64K -n 2 -w 1 --json "$tmp/rows.json"
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
sizes = [r["size"] for r in rows]
# allreduce, float: 4 B .. 64 KiB doubling
assert sizes == [4 << i for i in range(15)], sizes
assert d["collective"] == "allreduce" and d["ranks"] == 2 and d["check"] is True, d
assert d["wrong"] == 0, d["wrong"]
columns = ["hora_out_of_place", "hora_in_place", "mpi", "memcpy"] + (["gloo"] if d["gloo"] else [])
for r in rows:
    assert r["count"] * 4 == r["size"], r
    for c in columns:
        assert r[c] is not None and r[c]["time_us"] > 0, (c, r)
        if c != "memcpy":
            assert r[c]["wrong"] == 0, (c, r)
            assert r[c]["busbw_gbs"] == r[c]["algbw_gbs"], (c, r)  # 2(n-1)/n = 1 at 2 ranks
    assert r["hora_over_mpi"] is not None and r["hora_over_mpi"] > 0, r
print("ok: %d rows, columns %s" % (len(rows), ", ".join(columns)))
' "$tmp/rows.json"

# --trials 3: every column keeps its three timed loops and reports their median.
"$@" "$bench" -b 4K -e 16K -f 4 -n 2 -w 1 --trials 3 --json "$tmp/trials.json"
/usr/bin/python3 -c '
import json, statistics, sys
d = json.load(open(sys.argv[1]))
assert d["trials"] == 3 and d["wrong"] == 0, d
for r in d["rows"]:
    for c in ("hora_out_of_place", "hora_in_place", "mpi", "memcpy"):
        trials = r[c]["trials_us"]
        assert len(trials) == 3 and min(trials) > 0, (c, r)
        assert abs(r[c]["time_us"] - statistics.median(trials)) <= 1e-9 * r[c]["time_us"], (c, r)
print("ok: --trials 3 reports the median of three loops")
' "$tmp/trials.json"
