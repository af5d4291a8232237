# SPDX-License-Identifier: Apache-2.0
"""Forming and tearing down worlds and process sets: races, named phases, nothing left behind.

    MeshSwitch    a rank that switches its Gloo pairs to hora's transfers late (HORA_TEST_AT)
                  no longer loses its peers' first messages: the job forms at once
    PhaseNames    a phase that runs out of time says which set, which phase, which rank it
                  waited for and what that rank was doing
    SharedMemory  a rank killed while the shared segment is set up leaves nothing in /dev/shm,
                  and a segment left by a creator killed mid-setup is removed by the next job
    Stress        4 jobs at once, each forming and tearing down worlds and sets round after round
                  with HORA_TIMEOUT_S=5, on every launcher: every round forms (the short run of
                  tools/formation_stress.py, whose default is the long one)

Usage (meson): test_formation.py HORARUN ROUNDS_PROGRAM STRESS_TOOL BUILDDIR python|nopython
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from time_scale import scaled  # noqa: E402

HORARUN, ROUNDS, STRESS, BUILDDIR, HAVE_PYTHON = (sys.argv[1:6] + [""] * 5)[:5]
HAVE_PYTHON = HAVE_PYTHON == "python"
del sys.argv[1:6]


class Scratch(unittest.TestCase):
    """Each test in a directory of its own, where its jobs' flight recorder files go too."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hora-formation-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HORA_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "OMPI_",
                                    "PMIX_", "SLURM_"))}
        env["HORA_FLIGHT_RECORDER"] = os.path.join(self.tmp, "flight.{rank}.json")
        env["HORA_TIMEOUT_S"] = str(scaled(10))
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def horarun(self, np, rounds, env, timeout):
        start = time.monotonic()
        proc = subprocess.run([HORARUN, "-np", str(np), ROUNDS, str(rounds)], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
        return proc, time.monotonic() - start


class MeshSwitch(Scratch):
    def check_late(self, np, late):
        # Before the fix the late rank's Gloo thread ate the first message a peer sent on the
        # mesh, and the job hung until HORA_TIMEOUT_S (10 s here) in most rounds.
        env = self.env(HORA_TEST_AT="mesh-switch@%d:sleep=300" % late)
        proc, took = self.horarun(np, 3, env, scaled(60))
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("3 rounds ok", proc.stdout)
        # 3 rounds, each with up to 3 groups whose formation waits 0.3 s for the late rank
        self.assertLess(took, scaled(9), proc.stdout)

    def test_rank0_switches_late(self):
        self.check_late(2, 0)

    def test_rank1_switches_late_in_sets_too(self):
        self.check_late(3, 1)


class PhaseNames(Scratch):
    def test_timeout_names_phase_and_rank(self):
        # rank 1 spends 4 s before switching; the others wait for it for 1 s
        env = self.env(HORA_TEST_AT="mesh-switch@1:sleep=4000", HORA_TIMEOUT_S=1)
        proc, _ = self.horarun(3, 1, env, scaled(60))
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("[0] formation_rounds")), "")
        for words in ("round 0: hora_init", "forming the world: switching the gloo mesh",
                      "rank 1 of 3 has not switched", "within 1 s",
                      "ranks 1,2 are in this phase too"):
            self.assertIn(words, line, proc.stdout)

    def test_lost_rank_named_with_phase(self):
        env = self.env(HORA_TEST_AT="shm-open@1:kill")
        proc, _ = self.horarun(2, 1, env, scaled(60))
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("[0] formation_rounds")), "")
        for words in ("peer lost: forming the world: setting up the shared-memory segment",
                      "lost rank 1 of 2", "has exited)", "rank 1 (forming the world"):
            self.assertIn(words, line, proc.stdout)


class SharedMemory(Scratch):
    def segments(self):
        return set(glob.glob("/dev/shm/hora-*"))

    def test_killed_while_setting_up_leaves_nothing(self):
        if not os.path.isdir("/dev/shm"):
            self.skipTest("no /dev/shm")
        before = self.segments()
        for victim in (1, 0):
            env = self.env(HORA_TEST_AT="shm-open@%d:kill" % victim if victim else "shm-open@1:kill")
            proc, _ = self.horarun(3 if victim == 0 else 2, 1, env, scaled(60))
            self.assertNotEqual(proc.returncode, 0, proc.stdout)
        left = self.segments() - before
        self.assertEqual(left, set(), "left in /dev/shm: %s" % sorted(left))

    def test_stale_segment_of_dead_creator_removed(self):
        if not os.path.isdir("/dev/shm"):
            self.skipTest("no /dev/shm")
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = "/dev/shm/hora-%d-4242" % dead.pid
        fresh = "/dev/shm/hora-%d-4343" % dead.pid
        alive = "/dev/shm/hora-%d-4444" % os.getpid()
        try:
            for path in (stale, fresh, alive):
                with open(path, "wb") as f:
                    f.write(b"\0" * 4096)
            old = time.time() - 120
            os.utime(stale, (old, old))
            os.utime(alive, (old, old))
            proc, _ = self.horarun(2, 1, self.env(), scaled(60))
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertFalse(os.path.exists(stale), "the dead creator's old segment is still there")
            self.assertTrue(os.path.exists(fresh), "a segment younger than a minute was removed")
            self.assertTrue(os.path.exists(alive), "a live creator's segment was removed")
        finally:
            for path in (stale, fresh, alive):
                if os.path.exists(path):
                    os.unlink(path)


class Stress(Scratch):
    def test_four_jobs_at_once_on_every_launcher(self):
        """tools/formation_stress.py, short: 4 jobs at once of 2 and 3 ranks, 24 rounds on each
        launcher (horarun, torchrun's variables by hand, hora.run, elastic re-init), beside a busy
        loop, with HORA_TIMEOUT_S=5 (scaled): every round forms."""
        launchers = "horarun,env,hora.run,elastic" if HAVE_PYTHON else "horarun,env,elastic"
        proc = subprocess.run(
            [sys.executable, STRESS, "--rounds", "24", "--per-job", "6", "--jobs", "4",
             "--hogs", "1", "--builds", "0", "--timeout", str(scaled(5)), "--builddir", BUILDDIR,
             "--launchers", launchers],
            env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=scaled(400), check=False)
        sys.stderr.write("\n" + proc.stdout)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        count = len(launchers.split(","))
        self.assertIn("%d rounds, 0 failed jobs" % (24 * count), proc.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
