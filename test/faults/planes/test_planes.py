# SPDX-License-Identifier: Apache-2.0
"""A rank killed, or stopped and resumed, under each launcher and plane: every survivor gets an
error naming the rank, a stall report names it first, a resumed rank gets an error too, nobody
computes a wrong result, and the job ends on its own within a bound.

Usage (meson): test_planes.py GROUP FAULT_RANK MPIEXEC HORARUN
  GROUP: "mpi" (mpirun: MPI plane, Gloo plane, shared memory) or "env" (horarun, hand-started).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from picked_port import free_port  # noqa: E402  (beside other tests: safe)
from time_scale import scaled  # noqa: E402

GROUP, PROGRAM, MPIEXEC, HORARUN = (sys.argv[1:5] + [""] * 4)[:4]
del sys.argv[1:5]
RANKS = 3
VICTIM = 1
TIMEOUT_S = 1.5       # HORA_TIMEOUT_S
WARNING_S = 0.4       # HORA_STALL_WARNING_S
HOLD_S = 2.5          # survivors stay alive this long after their error
LINE = r"^(?:\[\d+\] )?"  # a line of a rank's, as horarun prefixes it or not
# Open MPI as the other tests run it: shared memory between ranks of one host, no device probing.
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader",
                "--mca", "btl_vader_single_copy_mechanism", "none"]


def base_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "HORA_", "MASTER_", "RANK",
                                "WORLD_SIZE", "LOCAL_"))}
    env.update(HORA_TIMEOUT_S=str(TIMEOUT_S), HORA_STALL_WARNING_S=str(WARNING_S))
    env.update(extra)
    return env


class Job:
    """One job of fault_rank under a launcher; its ranks' stderr lines, merged."""

    def __init__(self, launcher, extra_env, tmp, victim=VICTIM):
        self.tmp = tmp
        env = base_env(dict(extra_env, PID_DIR=tmp, VICTIM=str(victim),
                            HORA_FLIGHT_RECORDER=os.path.join(tmp, "flight.{rank}.json")))
        self.out_path = os.path.join(tmp, "out.txt")
        out = open(self.out_path, "wb")
        self.procs = []
        self.started = time.monotonic()
        if launcher.startswith("mpirun"):
            passed = sum((["-x", k] for k in sorted(env) if k.startswith(("HORA_", "HOW", "STEP",
                          "HOLD_S", "PID_DIR", "VICTIM"))), [])
            cmd = [MPIEXEC] + MPIRUN_FLAGS + passed + ["-np", str(RANKS), PROGRAM]
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        elif launcher == "horarun":
            cmd = [sys.executable, HORARUN, "-np", str(RANKS), PROGRAM]
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        else:  # hand-started env://, as torchrun's workers on separate machines would be
            port = free_port()
            for rank in range(RANKS):
                renv = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                            WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(RANKS))
                self.procs.append(subprocess.Popen([PROGRAM], env=renv, stdout=out,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        out.close()

    def text(self):
        with open(self.out_path, "rb") as f:
            return f.read().decode(errors="replace")

    def running(self):
        return any(p.poll() is None for p in self.procs)

    def wait_for(self, pattern, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text(), re.M)
            if m:
                return m
            if not self.running():
                return re.search(pattern, self.text(), re.M)
            time.sleep(0.05)
        return None

    def wait_end(self, limit):
        deadline = time.monotonic() + limit
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running()

    def pid(self, rank):
        path = os.path.join(self.tmp, "pid.%d" % rank)
        deadline = time.monotonic() + scaled(20)
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            except OSError:
                pass
            time.sleep(0.05)
        return None

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for rank in range(RANKS):  # ranks under a launcher are in their own groups
            try:
                with open(os.path.join(self.tmp, "pid.%d" % rank)) as f:
                    pid = int(f.read().strip())
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


LAUNCHERS = {
    "mpi": {"mpirun, MPI plane": ("mpirun", {"HORA_SHM": "off"}),
            "mpirun, Gloo plane": ("mpirun", {"HORA_SHM": "off", "HORA_CPU_BACKEND": "gloo"}),
            "mpirun, shared memory": ("mpirun", {})},
    "env": {"horarun": ("horarun", {}),
            "env:// by hand": ("env", {"HORA_SHM": "off"}),
            "env:// by hand, shared memory": ("env", {})},
}


class Planes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hora-faults-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def start(self, name, how, hold=0):
        launcher, extra = LAUNCHERS[GROUP][name]
        sub = tempfile.mkdtemp(dir=self.tmp)
        job = Job(launcher, dict(extra, HOW=how, HOLD_S=str(hold)), sub)
        self.addCleanup(job.kill)
        return job

    def check_no_wrong_data(self, job):
        self.assertNotIn("WRONG DATA", job.text())

    def stop_and_resume(self, name):
        """The victim stops at step 20; the survivors report it, time out naming it, hold on; the
        victim is resumed and must get an error too; then the job ends."""
        job = self.start(name, "stop", hold=HOLD_S)
        stall = job.wait_for(r"stall: rank 0 .*not taking part: .*rank %d \(" % VICTIM,
                             scaled(15) + TIMEOUT_S)
        t_stall = time.monotonic() - job.started
        self.assertIsNotNone(stall, "no stall report named rank %d:\n%s" % (VICTIM, job.text()))
        error = job.wait_for(LINE + r"rank 0: step \d+: (timeout|peer lost): (.*)$", scaled(10) + TIMEOUT_S)
        self.assertIsNotNone(error, "rank 0 got no error:\n" + job.text())
        self.assertRegex(error.group(2), r"rank %d\b" % VICTIM, "the error does not name the rank")
        t_error = time.monotonic() - job.started
        pid = job.pid(VICTIM)
        self.assertIsNotNone(pid)
        resumed = time.monotonic()
        os.kill(pid, signal.SIGCONT)
        late = job.wait_for(LINE + r"rank %d: step \d+: [a-z ]+: .+$" % VICTIM, scaled(HOLD_S + 6))
        t_late = time.monotonic() - resumed
        self.assertTrue(job.wait_end(scaled(30)), "the job did not end:\n" + job.text())
        sys.stderr.write("\n  %s, stop/resume: stall report at %.1f s, rank 0's error at %.1f s "
                         "(from the job's start), resumed rank's error %s, job over %.1f s after "
                         "the resume ... " % (name, t_stall, t_error,
                                              "%.2f s after its resume" % t_late if late else "none",
                                              time.monotonic() - resumed))
        self.check_no_wrong_data(job)
        if late is None:
            # the launcher may end the job before the resumed rank runs again (horarun does when
            # rank 0 exits); then the victim must not have outlived it
            self.assertFalse(job.running())
        return job, time.monotonic() - resumed

    def killed(self, name):
        job = self.start(name, "kill")
        self.assertTrue(job.wait_end(scaled(20) + TIMEOUT_S), "the job did not end:\n" + job.text())
        took = time.monotonic() - job.started
        self.check_no_wrong_data(job)
        sys.stderr.write("\n  %s, kill: job over %.1f s after its start ... " % (name, took))
        return job, took


class StoreHost(unittest.TestCase):
    """env:// by hand, rank 0 (which serves the store) stopped: the ranks left waiting still
    report the stall, saying that the store does not answer and who serves it (they used to
    print nothing: their watch waited on the store for HORA_TIMEOUT_S), then time out."""

    def test_store_host_stopped(self):
        if GROUP != "env":
            self.skipTest("env:// only")
        tmp = tempfile.mkdtemp(prefix="hora-faults-")
        self.addCleanup(shutil.rmtree, tmp, True)
        job = Job("env", {"HORA_SHM": "off", "HOW": "stop", "HOLD_S": "0",
                          "HORA_TIMEOUT_S": str(scaled(14)), "HORA_STALL_WARNING_S": "1"},
                  tmp, victim=0)
        self.addCleanup(job.kill)
        stall = job.wait_for(r"stall: rank \d of process set 0 has waited .*the presence channel "
                             r"failed: .*served by rank 0", scaled(30))
        self.assertIsNotNone(stall, "no stall report about the store:\n" + job.text())
        t_stall = time.monotonic() - job.started
        error = job.wait_for(LINE + r"rank [12]: step \d+: (timeout|peer lost): (.*)$", scaled(30))
        self.assertIsNotNone(error, "no error:\n" + job.text())
        self.assertRegex(error.group(2), r"rank 0\b", "the error does not name rank 0")
        sys.stderr.write("\n  store host stopped: stall report at %.1f s, first error at %.1f s ... "
                         % (t_stall, time.monotonic() - job.started))
        self.check_no_wrong_data = None


def make_tests():
    for name in LAUNCHERS.get(GROUP, {}):
        slug = re.sub(r"[^a-z]+", "_", name.lower()).strip("_")

        def stop(self, name=name):
            job, _ = self.stop_and_resume(name)
            if name.startswith("env://"):
                for r in range(RANKS):
                    if r != VICTIM:
                        self.assertRegex(job.text(), re.compile(
                            LINE + r"rank %d: step \d+: (timeout|peer lost): " % r, re.M))
                        self.assertRegex(job.text(), re.compile(
                            LINE + r"rank %d: shutdown -> success" % r, re.M))
            if name == "mpirun, MPI plane":
                # the resumed rank hears why at once, from the rank that gave up
                self.assertRegex(job.text(),
                                 r"rank %d: step \d+: peer lost: .*rank \d+ gave up on the job" % VICTIM)

        def kill(self, name=name):
            job, _ = self.killed(name)
            if not name.startswith("mpirun"):
                self.assertRegex(job.text(), r"rank 0: step \d+: peer lost: .*rank %d" % VICTIM)
            if name.startswith("env://"):  # nothing ends these jobs but hora: every survivor
                for r in range(RANKS):     # gets the error and its hora_shutdown returns
                    if r != VICTIM:
                        self.assertRegex(job.text(), re.compile(
                            LINE + r"rank %d: step \d+: peer lost: " % r, re.M))
                        self.assertRegex(job.text(), re.compile(
                            LINE + r"rank %d: shutdown -> success" % r, re.M))

        setattr(Planes, "test_stop_resume_" + slug, stop)
        setattr(Planes, "test_kill_" + slug, kill)


make_tests()

if __name__ == "__main__":
    if GROUP not in LAUNCHERS or not os.path.exists(PROGRAM):
        sys.exit("usage: test_planes.py mpi|env FAULT_RANK MPIEXEC HORARUN")
    unittest.main(verbosity=2)
