# SPDX-License-Identifier: Apache-2.0
"""hora_process_set_abort on each plane (abort_rank.c): the aborting rank's request ends at once
with the abort's status and reason and nothing writes into its tensor afterwards; the set's other
rank, arriving later, fails within seconds naming the aborting rank and the reason (it does not
get a result mixed from the aborting rank's reused tensor); the world goes on where the aborted
set was another (not under MPI, whose plane an abort breaks, as any timeout does).

Usage (meson): test_abort.py ABORT_RANK HORARUN MPIEXEC|none
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from time_scale import scaled  # noqa: E402

PROGRAM, HORARUN, MPIEXEC = (sys.argv[1:4] + ["", "", ""])[:3]
del sys.argv[1:4]
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader",
                "--mca", "btl_vader_single_copy_mechanism", "none"]


class Abort(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hora-abort-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_job(self, launcher, np_, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HORA_", "OMPI_", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE",
                                    "LOCAL_"))}
        env.update(DIR=self.tmp, HORA_TIMEOUT_S=str(scaled(20)),
                   HORA_FLIGHT_RECORDER=os.path.join(self.tmp, "flight.{rank}.json"))
        env.update({k: str(v) for k, v in extra.items()})
        if launcher == "mpirun":
            cmd = [MPIEXEC] + MPIRUN_FLAGS + ["-np", str(np_)]
            for name in ("DIR", "SET", "HORA_TIMEOUT_S", "HORA_FLIGHT_RECORDER", "HORA_SHM"):
                if name in env:
                    cmd += ["-x", name]
            cmd += [PROGRAM]
        else:
            cmd = [HORARUN, "-np", str(np_), PROGRAM]
        proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=scaled(90), check=False)
        return proc.stdout

    def check(self, out, first, world=False):
        self.assertIn("aborted after", out, out)
        self.assertIn("late rank failed after", out, out)
        late = next(l for l in out.splitlines() if "late rank failed after" in l)
        self.assertIn("test reason 42", late, out)
        self.assertIn("rank %d" % first, late, out)
        self.assertNotIn("became", out, out)
        if world:
            self.assertEqual(out.count("world ok"), 3, out)

    def test_world_shared_memory(self):
        self.check(self.run_job("horarun", 2), 0)

    def test_world_gloo(self):
        self.check(self.run_job("horarun", 2, HORA_SHM="off"), 0)

    def test_set_shared_memory_world_goes_on(self):
        self.check(self.run_job("horarun", 3, SET="1,2"), 0, world=True)

    def test_set_gloo_world_goes_on(self):
        self.check(self.run_job("horarun", 3, SET="0,2", HORA_SHM="off"), 0, world=True)

    def test_world_mpi(self):
        if MPIEXEC in ("", "none"):
            self.skipTest("no mpiexec")
        self.check(self.run_job("mpirun", 2, HORA_SHM="off"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
