# SPDX-License-Identifier: Apache-2.0
"""horarun forwards SIGINT and SIGTERM to every rank, once, and exits 128 + the signal;
SIGUSR1 is passed on without stopping the job; a second signal or horarun's death kills."""

import os
import signal
import subprocess
import time
import unittest

from launcher_util import TempDirTest, clean_env, kill_leftovers, process_gone, rank_cmd, \
    scaled, start_horarun, wait_for_files

NP = 3


class SignalForwarding(TempDirTest):

    def start_trapping_job(self, extra=()):
        job = start_horarun(["-np", str(NP)] + list(extra) + rank_cmd("trap", self.dir))
        self.addCleanup(self.stop, job)
        ready = [self.path("ready.%d" % r) for r in range(NP)]
        self.assertTrue(wait_for_files(ready), "the ranks did not start")
        return job

    def stop(self, job):
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        try:
            job.communicate(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            pass
        kill_leftovers(self.read_pids("pid."))

    def received(self):
        return {r: read_or_empty(self.path("got.%d" % r)).split() for r in range(NP)}

    def check_forwarded(self, sig, to_group):
        job = self.start_trapping_job()
        if to_group:
            # What Ctrl-C in a terminal does: the signal goes to the foreground process group,
            # which holds horarun but not the ranks, so each rank must get it exactly once.
            os.killpg(job.pid, sig)
        else:
            job.send_signal(sig)
        out, err = job.communicate(timeout=scaled(20))
        self.assertEqual(job.returncode, 128 + sig, err)
        name = signal.Signals(sig).name
        self.assertEqual(self.received(), {r: [name] for r in range(NP)})
        self.assertIn("horarun: received %s; forwarding it to %d ranks" % (name, NP), err)

    def test_sigterm(self):
        self.check_forwarded(signal.SIGTERM, to_group=False)

    def test_sigint(self):
        self.check_forwarded(signal.SIGINT, to_group=False)

    def test_ctrl_c_reaches_each_rank_once(self):
        self.check_forwarded(signal.SIGINT, to_group=True)

    def test_sigusr1_passed_on(self):
        job = self.start_trapping_job()
        job.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for_lines([self.path("got.%d" % r) for r in range(NP)]),
                        "SIGUSR1 did not reach every rank")
        self.assertIsNone(job.poll(), "SIGUSR1 must not stop the job")
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=scaled(20))
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertEqual(self.received(), {r: ["SIGUSR1", "SIGTERM"] for r in range(NP)})

    def start_sleepers(self, extra):
        # Rank -1 never fails: every rank sleeps 60 s beside a helper, ignoring SIGTERM.
        env = clean_env(IGNORE_TERM="1")
        job = start_horarun(["-np", str(NP)] + extra + rank_cmd("fail", self.dir, -1, 0), env=env)
        self.addCleanup(self.stop, job)
        self.assertTrue(wait_for_files([self.path("pid.%d" % r) for r in range(NP)]),
                        "the ranks did not start")
        return job

    def test_second_signal_kills_at_once(self):
        job = self.start_sleepers(["--grace", "60"])
        start = time.monotonic()
        job.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        self.assertIsNone(job.poll(), "the ranks ignore SIGTERM; horarun should still wait")
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=scaled(20))
        self.assertLess(time.monotonic() - start, scaled(10))
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("horarun: received SIGTERM again; killing %d ranks" % NP, err)
        pids = self.read_pids("pid.")
        self.assertTrue(wait_gone(pids), "processes left behind")

    def test_ranks_die_with_horarun(self):
        # horarun SIGKILLed cannot forward anything; the kernel stops its ranks (not their
        # children: the helpers are cleaned up by the test).
        job = self.start_sleepers([])
        job.kill()
        job.communicate(timeout=scaled(10))
        rank_pids = []
        for r in range(NP):
            with open(self.path("pid.%d" % r)) as f:
                rank_pids.append(int(f.read().split()[0]))
        self.assertTrue(wait_gone(rank_pids), "ranks outlived horarun")


def read_or_empty(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for_lines(paths, timeout=10.0):
    """Waits until every file exists and holds a whole line."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if all(read_or_empty(p).endswith("\n") for p in paths):
            return True
        time.sleep(0.02)
    return False


def wait_gone(pids, timeout=5.0):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if all(process_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


if __name__ == "__main__":
    unittest.main(verbosity=2)
