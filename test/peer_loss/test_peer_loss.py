# SPDX-License-Identifier: Apache-2.0
"""A rank dies or hangs mid-run in an env:// world started by hand (no launcher to stop the job,
as with torchrun's workers on separate machines): every survivor must get an error from hora
within HORA_TIMEOUT_S, naming what happened, and hora_shutdown must still return.

Usage (meson): test_peer_loss.py VICTIM_PROGRAM (test/launcher/hora_victim.c)."""

import os
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from time_scale import scaled  # noqa: E402

PROGRAM = None
RANKS = 3
VICTIM = 1
TIMEOUT_S = 4  # HORA_TIMEOUT_S


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_world(how, shm):
    port = free_port()
    procs = []
    for rank in range(RANKS):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "HORA_"))}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(RANKS),
                   HORA_TIMEOUT_S=str(TIMEOUT_S), HORA_SHM=shm, VICTIM=str(VICTIM), HOW=how)
        procs.append(subprocess.Popen([PROGRAM], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    return procs


class PeerLoss(unittest.TestCase):
    def run_case(self, how, shm):
        procs = start_world(how, shm)
        survivors = [r for r in range(RANKS) if r != VICTIM]
        try:
            # the victim stops itself at step 20, within a second of the start
            start = time.monotonic()
            deadline = start + scaled(1 + 10) + TIMEOUT_S
            while time.monotonic() < deadline and any(procs[r].poll() is None for r in survivors):
                time.sleep(0.05)
            took = time.monotonic() - start
            errors = {}
            for r in survivors:
                self.assertIsNotNone(procs[r].poll(), "rank %d still running after %.1f s "
                                     "(HORA_TIMEOUT_S=%d)" % (r, took, TIMEOUT_S))
                errors[r] = procs[r].stderr.read().decode(errors="replace")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                p.stderr.close()
        for r, text in errors.items():
            with self.subTest(rank=r):
                self.assertEqual(procs[r].returncode, 3, "rank %d:\n%s" % (r, text))
                self.assertIn("rank %d: hora_shutdown -> success" % r, text)
                want = "peer lost" if how == "kill" else "timeout"
                self.assertRegex(text, r"rank %d: step \d+: %s: allreduce 'grad'" % (r, want))
        return errors

    def test_killed_rank_gloo(self):
        errors = self.run_case("kill", "off")
        # every survivor names the dead rank and its pid (one may first see another survivor
        # leave): a killed process counts as gone from the moment it enters the kernel's exit
        # path, and a survivor gives a peer on its host a moment to get there, so this holds on
        # a loaded machine too
        for e in errors.values():
            self.assertRegex(e, r"rank %d of %d \(pid \d+" % (VICTIM, RANKS))

    def test_killed_rank_shared_memory(self):
        errors = self.run_case("kill", "auto")
        for e in errors.values():
            self.assertRegex(e, r"rank %d \(pid \d+\) has exited" % VICTIM)

    def test_hung_rank_gloo(self):
        self.run_case("stop", "off")

    def test_hung_rank_shared_memory(self):
        errors = self.run_case("stop", "auto")
        for r, e in errors.items():
            self.assertIn("rank %d waited" % r, e)
            self.assertIn("for ranks %d" % VICTIM, e)


if __name__ == "__main__":
    PROGRAM = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
