#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Forming worlds and process sets under load: many jobs at once, each forming and tearing down
its world again and again, on every way a world forms, while busy loops and compilers take the
cores.

    tools/formation_stress.py [--rounds N] [--jobs J] [--ranks 2,3] [--launchers L,...]
                              [--hogs H] [--builds B] [--timeout S] [--builddir DIR] [--keep-logs]

Each job is one launch of a rounds program whose every round is hora_init, an allreduce over the
world, two process sets created (at 3 ranks: of 2 ranks each, each with a Gloo mesh of its own),
an allreduce on each, the sets destroyed, and hora_shutdown; every sum is checked. J jobs run at
once (default 4), alternating between the rank counts of --ranks, until each launcher has run N
rounds (default 500: 2,000 over the four launchers). Launchers:

    horarun    tools/horarun -np K (env:// with horarun's variables and job token)
    env        torchrun's variables set by hand, one process per rank, a free MASTER_PORT
    hora.run   hora.run(fn, np=K) from /usr/bin/python3, fn doing the rounds through the Python API
    elastic    horarun's elastic agents (--min-np K): each hora_init joins the agents' next world

Every job runs with HORA_TIMEOUT_S=S (default 5): a formation that loses a message, or waits for
a rank that will not come, fails the job instead of stalling it. H busy loops (default one per
core) and B compilers (default 1: g++ -O2 of one of hora's sources, over and over) load the machine
meanwhile. Prints a line per launcher (rounds, failed jobs, the slowest round, seconds) and last
"N rounds, N failed jobs"; the logs of failed jobs are kept in a directory it names. Exits 1 if any
job failed. Needs the build (--builddir, default build/; `ninja -C build` first).
"""

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HORARUN = os.path.join(ROOT, "tools", "horarun")
PYTHON = "/usr/bin/python3"

# hora.run's rank function: the rounds of formation_rounds.c through the Python API.
RANK_SCRIPT = r'''
import sys
import numpy as np
import hora


def rounds(n):
    slowest = 0.0
    import time
    for i in range(n):
        began = time.monotonic()
        hora.init()
        rank, size = hora.rank(), hora.size()

        def check(ranks, process_set=hora.global_process_set):
            x = np.array([(rank + 1) * (j + 1) + i for j in range(257)], np.float32)
            got = hora.allreduce(x, op=hora.Sum, process_set=process_set)
            want = np.array([sum((r + 1) * (j + 1) + i for r in ranks) for j in range(257)],
                            np.float32)
            if not np.array_equal(got, want):
                raise AssertionError("round %d: wrong sum on ranks %s" % (i, ranks))

        check(list(range(size)))
        first = list(range(size - 1)) if size >= 3 else [0]
        last = list(range(1, size)) if size >= 3 else [size - 1]
        a = hora.add_process_set(first)
        b = hora.add_process_set(last)
        if a.included():
            check(first, a)
        if b.included():
            check(last, b)
        hora.remove_process_set(a)
        hora.remove_process_set(b)
        hora.shutdown()
        slowest = max(slowest, time.monotonic() - began)
    return slowest


size, n, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
results = hora.run(rounds, args=(n,), np=size, timeout=timeout)
print("formation_rounds: %d rounds ok (slowest %.2f s)" % (n, max(results)))
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(timeout_s, scratch):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HORA_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "MASTER_",
                                "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")}
    env.update(HORA_TIMEOUT_S=str(timeout_s),
               HORA_FLIGHT_RECORDER=os.path.join(scratch, "flight.{rank}.json"))
    return env


def run_job(launcher, ranks, rounds, args, scratch):
    """One job: returns (ok, rounds done, slowest round in s, output)."""
    program = os.path.join(args.builddir, "test", "formation", "formation_rounds")
    env = base_env(args.timeout, scratch)
    limit = rounds * (args.timeout + 10) + 60  # a job is killed only if hora's own limits fail
    if launcher == "horarun":
        cmd = [sys.executable, HORARUN, "-np", str(ranks), program, str(rounds)]
    elif launcher == "elastic":
        cmd = [sys.executable, HORARUN, "-np", str(ranks), "--min-np", str(ranks),
               "--rdzv-timeout", str(args.timeout), program, str(rounds)]
    elif launcher == "hora.run":
        env["PYTHONPATH"] = os.path.join(args.builddir, "bindings", "python")
        cmd = [PYTHON, "-c", RANK_SCRIPT, str(ranks), str(rounds), str(limit)]
    else:  # env: torchrun's variables by hand
        port = free_port()
        procs = []
        out = tempfile.TemporaryFile(dir=scratch)
        for r in range(ranks):
            renv = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                        WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks))
            procs.append(subprocess.Popen([program, str(rounds)], env=renv, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + limit
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
        out.close()
        return finish(all(c == 0 for c in codes), rounds, text)
    try:
        proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=limit, check=False,
                              start_new_session=True)
        return finish(proc.returncode == 0, rounds, proc.stdout.decode(errors="replace"))
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if e.output else ""
        return finish(False, rounds, out + "\n(killed after %d s)" % limit)


def finish(ok, rounds, text):
    m = re.search(r"formation_rounds: (\d+) rounds ok \(slowest ([\d.]+) s\)", text)
    ok = ok and m is not None and int(m.group(1)) == rounds
    return ok, rounds if ok else 0, float(m.group(2)) if m else 0.0, text


class Load:
    """Busy loops and compilers, until stop()."""

    def __init__(self, hogs, builds, scratch):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(hogs)]
        source = os.path.join(ROOT, "lib", "core", "set_engine.cpp")
        includes = ["-I" + os.path.join(ROOT, "lib", "layers", "core"),
                    "-I" + os.path.join(ROOT, "include")]
        compile_once = ("while :; do g++ -std=c++17 -O2 -DHORA_INTERNAL_BUILD %s -c %s -o %s/load.o "
                        ">/dev/null 2>&1 || sleep 1; done"
                        % (" ".join(includes), source, scratch))
        self.procs += [subprocess.Popen(["bash", "-c", compile_once], start_new_session=True)
                       for _ in range(builds)]

    def stop(self):
        for p in self.procs:
            try:
                if p.args[0] == "bash":
                    os.killpg(p.pid, 9)  # the loop and the compiler it runs
                else:
                    p.kill()
            except OSError:
                pass
            p.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500, help="rounds per launcher")
    parser.add_argument("--jobs", type=int, default=4, help="jobs at once")
    parser.add_argument("--ranks", default="2,3", help="ranks per job, taken in turn")
    parser.add_argument("--per-job", type=int, default=25, help="rounds in each job")
    parser.add_argument("--launchers", default="horarun,env,hora.run,elastic")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--builds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=5.0, help="HORA_TIMEOUT_S of every job")
    parser.add_argument("--builddir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--keep-logs", action="store_true", help="keep every job's log")
    args = parser.parse_args()
    args.builddir = os.path.abspath(args.builddir)
    ranks = [int(r) for r in args.ranks.split(",")]
    launchers = [l for l in args.launchers.split(",") if l]
    unknown = set(launchers) - {"horarun", "env", "hora.run", "elastic"}
    if unknown:
        parser.error("unknown launchers: %s" % ", ".join(sorted(unknown)))
    program = os.path.join(args.builddir, "test", "formation", "formation_rounds")
    if not os.access(program, os.X_OK):
        parser.error("%s not built: run ninja -C %s first" % (program, args.builddir))
    logs = tempfile.mkdtemp(prefix="hora-formation-stress-")
    scratch = tempfile.mkdtemp(prefix="hora-formation-scratch-")
    load = Load(args.hogs, args.builds, scratch)
    print("load: %d busy loops, %d compilers; %d jobs at once, HORA_TIMEOUT_S=%g"
          % (args.hogs, args.builds, args.jobs, args.timeout), flush=True)
    total_rounds = total_failed = 0
    try:
        for launcher in launchers:
            start = time.monotonic()
            lock = threading.Lock()
            state = {"queued": 0, "done": 0, "failed": 0, "slowest": 0.0, "next": 0}

            def worker():
                while True:
                    with lock:
                        if state["queued"] >= args.rounds:
                            return
                        n = min(args.per_job, args.rounds - state["queued"])
                        state["queued"] += n
                        k = ranks[state["next"] % len(ranks)]
                        index = state["next"]
                        state["next"] += 1
                    ok, done, slowest, text = run_job(launcher, k, n, args, scratch)
                    with lock:
                        state["done"] += done
                        state["slowest"] = max(state["slowest"], slowest)
                        if not ok:
                            state["failed"] += 1
                        if not ok or args.keep_logs:
                            path = os.path.join(logs, "%s.%d.%s.log"
                                                % (launcher, index, "ok" if ok else "FAILED"))
                            with open(path, "w") as f:
                                f.write(text)

            threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            took = time.monotonic() - start
            print("%-9s %5d rounds ok of %d, %d failed jobs, slowest round %.2f s, %.0f s"
                  % (launcher, state["done"], args.rounds, state["failed"], state["slowest"], took),
                  flush=True)
            total_rounds += state["done"]
            total_failed += state["failed"]
    finally:
        load.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if total_failed or args.keep_logs:
        print("logs: %s" % logs)
    else:
        shutil.rmtree(logs, ignore_errors=True)
    print("%d rounds, %d failed jobs" % (total_rounds, total_failed))
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
