#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Time from a killed worker to training again, hora's agents against torchrun's.

    bench/elastic/recovery.py --build BUILD [--runs 5] [--np 2]

Each scenario starts a job in which one worker dies at step 5 and prints when ("KILLED_AT t");
rank 0 prints when its first collective after the recovery is done ("RESUMED_AT t"). Recovery =
RESUMED_AT - KILLED_AT, wall clock, on this machine: median, mean, min and max over --runs.

  hora restart, C          horarun --max-restarts 1; every worker restarts (test/elastic/restart_prog.c)
  hora elastic, C          horarun --min-np; survivors re-form in process (survivor_prog.c)
  hora restart, torch      horarun --max-restarts 1, a torch.distributed Gloo script (torchrun_worker.py)
  hora elastic, torch      horarun --min-np; hora.torch.elastic survivors (hora_elastic_worker.py)
  torchrun restart, torch  torchrun --max_restarts 1 --monitor_interval 0.1, the same script
  torchrun default         the same with torchrun's default --monitor_interval (5 s)

The torch rows need torch for /usr/bin/python3. Standard library only."""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_PY = "/usr/bin/python3"


def torch_available():
    return subprocess.run([TORCH_PY, "-c", "import torch.distributed.run"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def once(argv, env):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, REPORT_TIMES="1", HORA_LOG_LEVEL="error", **env),
                          timeout=300)
    killed = re.search(r"KILLED_AT (\d+\.\d+)", proc.stdout)
    resumed = re.search(r"RESUMED_AT (\d+\.\d+)", proc.stdout)
    if proc.returncode != 0 or not killed or not resumed:
        sys.stderr.write("run failed (status %d):\n%s\n" % (proc.returncode, proc.stdout[-3000:]))
        return None
    return (float(resumed.group(1)) - float(killed.group(1))) * 1000.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True, help="the meson build folder")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--np", type=int, default=2, help="workers (elastic: one more, then one fewer)")
    args = p.parse_args()
    horarun = [sys.executable, os.path.join(ROOT, "tools", "horarun")]
    restart_prog = os.path.join(args.build, "test", "elastic", "elastic_restart_prog")
    survivor_prog = os.path.join(args.build, "test", "elastic", "elastic_survivor_prog")
    worker = os.path.join(HERE, "torchrun_worker.py")
    store = {"HORARUN_HORA_STORE": os.path.join(args.build, "tools", "hora-store")}
    n = str(args.np)
    scenarios = [
        ("hora restart, C", horarun + ["-np", n, "--max-restarts", "1", restart_prog], store),
        ("hora elastic, C", horarun + ["-np", str(args.np + 1), "--min-np", n, survivor_prog],
         store),
    ]
    if torch_available():
        # Debian's torch 1.13 on Python 3.11 fails on torchrun's default --redirects/--tee "0"
        # (an IntFlag change); "1" passes stdout through, which is all we read.
        torchrun = [TORCH_PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                    n, "--max_restarts", "1", "--redirects", "1", "--tee", "1", "--log_dir",
                    "/tmp/hora-recovery-torchrun"]
        scenarios += [
            ("hora restart, torch", horarun + ["-np", n, "--max-restarts", "1", TORCH_PY, worker],
             store),
            ("hora elastic, torch", horarun + ["-np", str(args.np + 1), "--min-np", n, TORCH_PY,
                                                 os.path.join(HERE, "hora_elastic_worker.py")],
             dict(store, PYTHONPATH=os.path.join(args.build, "bindings", "python"))),
            ("torchrun restart, torch", torchrun + ["--monitor_interval", "0.1", worker], {}),
            ("torchrun default, torch", torchrun + [worker], {}),
        ]
    else:
        print("# no torch for %s: the torch rows are left out" % TORCH_PY)
    print("# recovery: killed worker -> rank 0's first collective after it, ms (%d runs each)"
          % args.runs)
    print("# %-26s %10s %10s %10s %10s" % ("scenario", "median", "mean", "min", "max"))
    for name, argv, env in scenarios:
        times = [t for t in (once(argv, env) for _ in range(args.runs)) if t is not None]
        if not times:
            print("  %-26s %10s" % (name, "failed"))
            continue
        print("  %-26s %10.1f %10.1f %10.1f %10.1f" % (name, statistics.median(times),
                                                     statistics.mean(times), min(times),
                                                     max(times)))


if __name__ == "__main__":
    main()
