# SPDX-License-Identifier: Apache-2.0
"""hora.torch's hvd.init() and a torch.distributed group ("hora" or "gloo") in one process,
created in either order, at 2 ranks: with torchrun's variables set by hand, under mpirun, and
with nothing but Slurm's variables (srun faked on this host). Each rank checks an allreduce on
both faces against the sum it computes itself (coexist_worker.py). The launches of a test run at
once, under one watchdog."""

import os
import random
import signal
import socket
import subprocess
import sys

import pytest

from conftest import HERE, harness

WORKER = os.path.join(HERE, "coexist_worker.py")
ORDERS = ["hvd-hora", "hora-hvd", "hvd-gloo", "gloo-hvd"]
SLURM_PORTS = (10000, 30000)  # hora's Slurm rule: 10000 + SLURM_JOB_ID % 20000


def clean_env():
    """This environment without any launcher's variables."""
    drop = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "NODE_RANK", "GROUP_RANK", "HORA_BOOTSTRAP", "HORA_AGENT_STORE", "HORA_ELASTIC")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_")) and k not in drop}
    env.setdefault("HORA_TIMEOUT_S", str(int(harness.scaled(30))))
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port(low=1024, high=65536):
    """A port in [low, high) free here, for torch's store (hora's own is picked by rank 0)."""
    for _ in range(200):
        port = random.randrange(low, high)
        try:
            with socket.socket() as s:
                s.bind(("", port))
            return port
        except OSError:
            continue
    raise AssertionError("no free port in [%d, %d)" % (low, high))


def run_all(jobs, timeout=90):
    """Starts every job (label, argv, env) at once; returns {label: output}. Fails naming the job
    and with its output when one exits non-zero, and kills them all when the watchdog fires."""
    procs = [(label, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
             for label, argv, env in jobs]
    outputs, failures = {}, []
    try:
        for label, proc in procs:
            try:
                out, _ = proc.communicate(timeout=harness.scaled(timeout))
            except subprocess.TimeoutExpired:
                for _, p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                failures.append("%s: watchdog fired after %d s" % (label, harness.scaled(timeout)))
            outputs[label] = out.decode(errors="replace")
            if proc.returncode != 0:
                failures.append("%s exited with %s" % (label, proc.returncode))
    finally:
        for _, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    assert not failures, "\n".join(failures) + "\n" + "\n".join(
        "---- %s\n%s" % (label, out) for label, out in outputs.items())
    return outputs


def check(outputs, labels_orders):
    """Every rank of each 2-rank job said its order agreed."""
    for label, order in labels_orders:
        for rank in range(2):
            assert "rank %d of 2: %s agree" % (rank, order) in outputs[label], outputs[label]


def test_torchrun_variables():
    """The four orders, one process per rank started here with torchrun's variables."""
    jobs = []
    for order in ORDERS:
        port = free_port()
        for rank in range(2):
            env = dict(clean_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
            jobs.append(("%s/%d" % (order, rank), [harness.PYTHON, "-u", WORKER, order], env))
    outputs = run_all(jobs)
    for order in ORDERS:
        for rank in range(2):
            assert "rank %d of 2: %s agree" % (rank, order) in outputs["%s/%d" % (order, rank)]


@pytest.mark.skipif("mpirun" not in harness.launchers(), reason="no mpirun in this build")
def test_mpirun():
    """Under a plain mpirun hora's world is MPI's and torch's variables come from the import of
    hora.distributed: here after hvd.init() too, which must leave hora running."""
    env = clean_env()
    saved = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        jobs = [("hvd-hora late", harness.command(2, WORKER, ["hvd-hora", "late"], "mpirun"), env),
                ("gloo-hvd", harness.command(2, WORKER, ["gloo-hvd"], "mpirun"), env)]
    finally:
        os.environ.update(saved)
    outputs = run_all(jobs)
    check(outputs, [("hvd-hora late", "hvd-hora"), ("gloo-hvd", "gloo-hvd")])


def slurm_job_id():
    """A job id whose Slurm port is free here."""
    port = free_port(*SLURM_PORTS)
    return 1000000 + port - SLURM_PORTS[0]  # 10000 + id % 20000 == port


def test_slurm():
    """Tasks with Slurm's variables only (as srun sets them; the node list's first host is this
    one): init_process_group("hora") then hvd.init(), and hvd.init() (hora's own Slurm
    bootstrap) before hora.distributed fills torch's variables for a Gloo group."""
    jobs = []
    for order, args in (("hora-hvd", ["hora-hvd"]), ("hvd-gloo late", ["hvd-gloo", "late"])):
        job = slurm_job_id()
        for task in range(2):
            env = dict(clean_env(), SLURM_JOB_ID=str(job), SLURM_PROCID=str(task),
                       SLURM_NTASKS="2", SLURM_LOCALID=str(task), SLURM_NODEID="0",
                       SLURM_STEP_NODELIST="127.0.0.[1-3],elsewhere",
                       SLURM_JOB_NODELIST="elsewhere[01-04]", SLURM_STEP_TASKS_PER_NODE="2",
                       SLURM_TASKS_PER_NODE="2(x2)")
            jobs.append(("%s/%d" % (order, task), [harness.PYTHON, "-u", WORKER] + args, env))
    outputs = run_all(jobs)
    for order in ("hora-hvd", "hvd-gloo late"):
        for task in range(2):
            said = "rank %d of 2: %s agree" % (task, order.split()[0])
            assert said in outputs["%s/%d" % (order, task)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
