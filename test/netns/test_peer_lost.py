# SPDX-License-Identifier: Apache-2.0
"""A rank killed across namespace hosts, on the default multi-host plane: every survivor's
collective fails with "peer lost" (never wrong data, never a hang), every survivor's message names
the victim (directly, or as what the rank that failed first lost), and the job ends within
seconds, whether the victim shares the host of rank 0 or not.

    test_peer_lost.py CLUSTER_TOOL FAULT_RANK    (exits 77 where no cluster can be built)
"""
import re
import subprocess
import sys
import time
import unittest

TOOL, PROG = sys.argv[1], sys.argv[2]


class PeerLost(unittest.TestCase):
    def run_victim(self, victim):
        start = time.monotonic()
        proc = subprocess.run(
            [TOOL, "--hosts", "2", "-R", "2", "-x", "HOW=kill", "-x", "VICTIM=%d" % victim,
             "-x", "STEP=20", "-x", "HORA_TIMEOUT_S=60", PROG],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        took = time.monotonic() - start
        out = proc.stdout.decode(errors="replace")
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertNotIn("WRONG DATA", out)
        self.assertLess(took, 30, "the job took %.1f s to end:\n%s" % (took, out))
        reports = re.findall(r"rank (\d): step \d+: peer lost: (.*)", out)
        survivors = {int(r) for r, _ in reports}
        self.assertEqual(survivors, {0, 1, 2, 3} - {victim}, out)
        # Every survivor names the victim: the rank it lost, or the rank that failed first and
        # what that rank lost (a survivor whose neighbour gave up used to name the neighbour).
        for rank, message in reports:
            self.assertRegex(message, r"lost its connection to rank %d\b" % victim,
                             "rank %s does not name rank %d:\n%s" % (rank, victim, out))

    def test_victim_on_another_host(self):
        self.run_victim(3)

    def test_victim_beside_rank_0(self):
        self.run_victim(1)


if __name__ == "__main__":
    check = subprocess.run([TOOL, "--check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check.returncode != 0:
        print("SKIP: " + check.stdout.decode(errors="replace").strip())
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
