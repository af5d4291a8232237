#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The timeline end to end: a 2-rank job writes one file per rank (HORA_TIMELINE under mpirun,
hora_timeline_start/stop under horarun), every file is a JSON array a trace viewer takes, each
tensor shows its phases in order, the engine row carries sizes and bandwidth, and
hora-timeline-merge puts the ranks on one clock.

    check_timeline.py --example HORA_EXAMPLE --api TIMELINE_API --merge TOOL
                      [--horarun HORARUN] [--mpiexec MPIEXEC -- MPIEXEC_ARGS...]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from time_scale import scaled  # noqa: E402

TIMEOUT_S = scaled(120)  # per job: a hang fails the test instead of holding up CI
EPS_US = 0.002   # timestamps are written with 3 decimals (nanoseconds)


def run(cmd, env):
    full_env = dict(os.environ, HORA_TIMEOUT_S=str(int(scaled(60))), **env)
    try:
        out = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=TIMEOUT_S, text=True, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"FAIL: {cmd} ran past {TIMEOUT_S:.0f} s:\n{e.output}")
    if out.returncode != 0:
        raise SystemExit(f"FAIL: {cmd} exited {out.returncode}:\n{out.stdout}")
    return out.stdout


def rows_and_events(path):
    with open(path) as f:
        events = json.load(f)  # the whole file: a complete JSON array
    assert isinstance(events, list) and events, f"{path}: not a JSON array of records"
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    clock = [e["args"] for e in events if e.get("name") == "hora_clock"]
    assert len(clock) == 1, f"{path}: {len(clock)} hora_clock records"
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] > 0, f"{path}: bad span {e}"
    return rows, spans, clock[0]


def check_rank_file(path, rank, traced, untraced):
    rows, spans, clock = rows_and_events(path)
    assert clock["rank"] == rank and clock["size"] == 2, f"{path}: clock record {clock}"
    by_row = {}
    for e in spans:
        by_row.setdefault(rows.get(e["tid"], "?"), []).append(e)
    for name in untraced:
        assert name not in by_row, f"{path}: '{name}' ran outside start/stop but was traced"
    for name, times in traced.items():
        phases = sorted(by_row.get(name, []), key=lambda e: e["ts"])
        ops = [e for e in phases if e["name"] == "ALLREDUCE"]
        assert len(ops) == times, f"{path}: '{name}' has {len(ops)} ALLREDUCE spans, not {times}"
        for op in ops:
            queued = [e for e in phases if e["name"] == "QUEUED" and e["ts"] <= op["ts"]]
            negotiated = [e for e in phases if e["name"] == "NEGOTIATE" and e["ts"] <= op["ts"]]
            assert queued and negotiated, f"{path}: '{name}' ALLREDUCE without its earlier phases"
            q, n = queued[-1], negotiated[-1]
            assert abs(q["ts"] + q["dur"] - n["ts"]) <= EPS_US, f"{path}: QUEUED {q} then NEGOTIATE {n}"
            assert n["ts"] + n["dur"] <= op["ts"] + EPS_US, f"{path}: NEGOTIATE {n} ends after {op}"
    engine = [e for e in by_row.get("engine", []) if e["name"] == "ALLREDUCE"]
    assert engine, f"{path}: no ALLREDUCE on the engine row"
    for e in engine:
        a = e["args"]
        assert a["tensors"] >= 1 and a["bytes"] > 0 and a["GB/s"] >= 0, f"{path}: engine span {e}"
        # bandwidth as written: bytes over the span's own duration
        if e["dur"] > 1:
            assert abs(a["GB/s"] - a["bytes"] / (e["dur"] * 1e3)) <= 0.01 + 0.01 * a["GB/s"], e
    return by_row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", required=True)
    ap.add_argument("--api", required=True)
    ap.add_argument("--merge", required=True)
    ap.add_argument("--horarun")
    ap.add_argument("--mpiexec")
    ap.add_argument("mpiexec_args", nargs="*")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hora-timeline-")
    try:
        check(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left behind in /tmp
    print("timeline: OK")


def check(args, tmp):
    python = "/usr/bin/python3"

    if args.mpiexec:
        # HORA_TIMELINE on every rank of an MPI job running the C example.
        trace = os.path.join(tmp, "example.json")
        run([args.mpiexec, *args.mpiexec_args, "-np", "2", "-x", f"HORA_TIMELINE={trace}",
             args.example, "2"], {})
        per_rank = []
        for r in range(2):
            by_row = check_rank_file(os.path.join(tmp, f"example.rank{r}.json"), r, {}, [])
            layers = [n for n in by_row if n.startswith("layer")]
            assert len(layers) >= 10, f"rank {r}: only {len(layers)} layer tensors traced"
            per_rank.append(set(layers))
        assert per_rank[0] == per_rank[1], "the ranks traced different tensors"
        out = run([python, args.merge, trace], {})
        assert "2 ranks" in out, out
        with open(trace) as f:
            merged = json.load(f)
        assert {e["pid"] for e in merged if "pid" in e} == {0, 1}, "merged file lacks a rank"
        spans = [e["ts"] for e in merged if e.get("ph") == "X"]
        # One host: both ranks count from rank 0's start-up barrier; the job lasts seconds.
        assert min(spans) > -1e6 and max(spans) < 1e8, (min(spans), max(spans))
        print("HORA_TIMELINE under mpirun: OK")

    if args.horarun:
        # hora_timeline_start/stop under horarun (env://, Gloo): only the ops in between. The
        # Gloo plane itself carries the allreduces (no shared memory), with an algorithm forced:
        # the engine row names the one that ran.
        trace = os.path.join(tmp, "api.json")
        out = run([python, args.horarun, "-np", "2", args.api, trace],
                  {"HORA_SHM": "off", "HORA_ALGORITHM": "allreduce=ring"})
        assert out.count("timeline_api: OK") == 2, out
        for r in range(2):
            by_row = check_rank_file(os.path.join(tmp, f"api.rank{r}.json"), r,
                                     {"traced.small": 3, "traced.large": 3},
                                     ["untraced.before", "untraced.after"])
            ran = {e["args"].get("algorithm") for e in by_row["engine"] if e["name"] == "ALLREDUCE"}
            assert ran == {"ring"}, f"rank {r}: the engine row's allreduces ran {ran}, not the forced ring"
        print("hora_timeline_start/stop under horarun, an algorithm forced: OK")


if __name__ == "__main__":
    main()
