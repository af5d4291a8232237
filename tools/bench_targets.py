#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Runs hora's benchmarks several times and reports each performance target of the CPU path as
the min / median / max, over the runs, of a ratio measured within one run.

usage: tools/bench_targets.py [--runs N] [--builddir DIR] [--quick] [--json FILE] -- LAUNCHER...
  LAUNCHER: how to start two ranks, e.g. (tools/mpirun_flags.sh's HORA_MPIRUN_BENCH_ARGS)
    mpirun --allow-run-as-root --bind-to core --mca pml ob1 --mca btl self,vader -np 2

Per run: hora-bench from 4 KiB to 16 MiB (-w 40 -n 20: small ops need a warm engine; --trials 5:
twenty 4 KiB ops take 20 us, which one preempted thread can double), hora-bench at 64 and 256 MiB
(-w 2 -n 3 --trials 3) under Open MPI's default allreduce and again under its algorithm 2
(the best one here for large messages, chosen with coll_tuned MCA parameters), and hora-grads
(ResNet-50 and ViT-B/16 steps, the 4-byte latency). Nothing here asserts a time: this prints.
--quick shrinks every size and count, for a test that the script works.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ALG2 = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "2"]


def run_json(cmd, path):
    """Runs cmd (which writes JSON to path); returns the parsed JSON."""
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit("bench_targets: %s\nfailed (exit %d):\n%s" % (" ".join(cmd), done.returncode,
                                                              done.stderr[-4000:]))
    with open(path) as f:
        return json.load(f)


def rows_by_size(bench):
    return {row["size"]: row for row in bench["rows"]}


def one_run(args, launcher, tmp):
    bench = os.path.join(args.builddir, "bench", "hora-bench")
    grads = os.path.join(args.builddir, "bench", "hora-grads")
    out = os.path.join(tmp, "out.json")
    if args.quick:
        small = ["-b", "4K", "-e", "16K", "-f", "4", "-w", "2", "-n", "2", "--trials", "2"]
        large = ["-b", "64K", "-e", "256K", "-f", "4", "-w", "1", "-n", "1", "--trials", "2"]
        steps = ["--steps", "1", "--warmup", "0", "--latency", "10"]
    else:
        small = ["-b", "4K", "-e", "16M", "-f", "4", "-w", "40", "-n", "20", "--trials", "5"]
        large = ["-b", "64M", "-e", "256M", "-f", "4", "-w", "2", "-n", "3", "--trials", "3"]
        steps = ["--steps", "10", "--warmup", "2", "--latency", "1000"]
    figures = {}
    small = small + ["--planes", "mpi"]  # the targets are hora on MPI against raw MPI
    large = large + ["--planes", "mpi"]
    steps = steps + ["--planes", "mpi"]
    small_rows = rows_by_size(run_json(launcher + [bench] + small + ["--gloo", "0", "--memcpy", "0",
                                                                    "--json", out], out))
    for size, row in sorted(small_rows.items()):
        figures["hora/MPI %s" % human(size)] = row["hora_over_mpi"]
    default = rows_by_size(run_json(launcher + [bench] + large + ["--gloo", "0", "--json", out], out))
    alg2_launcher = launcher[:1] + ALG2 + launcher[1:]
    alg2 = rows_by_size(run_json(alg2_launcher + [bench] + large + ["--gloo", "0", "--memcpy", "0",
                                                                   "--json", out], out))
    for size in sorted(default):
        figures["hora/MPI default %s" % human(size)] = default[size]["hora_over_mpi"]
        figures["hora/MPI algorithm 2 %s" % human(size)] = alg2[size]["hora_over_mpi"]
        figures["hora/memcpy %s" % human(size)] = default[size]["hora_over_memcpy"]
    g = run_json(launcher + [grads] + steps + ["--json", out], out)
    for m in g["models"]:
        figures["%s: per-tensor MPI / hora" % m["name"]] = m["mpi_per_tensor_over_hora"]
        figures["%s: hora step ms" % m["name"]] = m["hora_fusion_on"]["median_ms"]
    figures["4-byte latency, hora us"] = g["latency"]["hora_us"]
    return figures


def human(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return "%d %s" % (size >> shift, unit)
    return "%d B" % size


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--builddir", default="build")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument("launcher", nargs=argparse.REMAINDER)
    args = p.parse_args()
    launcher = args.launcher[1:] if args.launcher[:1] == ["--"] else args.launcher
    if not launcher or args.runs < 1:
        p.error("give --runs >= 1 and the launcher after --")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            print("# run %d of %d" % (i + 1, args.runs), file=sys.stderr, flush=True)
            runs.append(one_run(args, launcher, tmp))
    names = list(runs[0])
    width = max(len(n) for n in names)
    print("# %d runs; each figure is a ratio (or time) taken within one run" % args.runs)
    print("%-*s %9s %9s %9s" % (width, "# figure", "min", "median", "max"))
    for n in names:
        vals = [r[n] for r in runs if n in r]
        print("%-*s %9.3g %9.3g %9.3g" % (width, n, min(vals), statistics.median(vals), max(vals)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
