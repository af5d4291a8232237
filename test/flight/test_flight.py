# SPDX-License-Identifier: Apache-2.0
"""tools/hora-flight-check on hand-made flight recorder files, and on the files real jobs write:
a stalled tensor (HORA_STALL_SHUTDOWN_S), SIGUSR1 through horarun, and a killed rank.

Usage (meson): test_flight.py TOOL STALL_DEMO VICTIM HORARUN [MPIEXEC]"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from time_scale import scaled  # noqa: E402

TOOL = STALL_DEMO = VICTIM = HORARUN = MPIEXEC = None
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
             "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]


def op(seq, name, state="done", nbytes=1024, status=None, set_id=0):
    return {"id": seq + 100, "set": set_id, "seq": seq, "name": name, "op": "allreduce",
            "dtype": "float32", "bytes": nbytes, "state": state,
            "status": status or ("success" if state == "done" else "timeout"),
            "submitted_us": 1, "started_us": 2 if seq >= 0 else -1, "ended_us": 3}


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "HORA_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


class Check(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, rank, size, ops, reason="a test"):
        with open(os.path.join(self.dir.name, "hora-flight.%d.json" % rank), "w") as f:
            json.dump({"hora_flight_recorder": {
                "version": 1, "rank": rank, "size": size, "host": "h", "pid": 100 + rank,
                "reason": reason, "capacity": 1024, "start_unix_us": 0, "dumped_us": 9,
                "ops": ops}}, f)

    def check(self, want_status=1):
        done = subprocess.run([sys.executable, TOOL, self.dir.name], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=scaled(60))
        out = done.stdout.decode()
        self.assertEqual(done.returncode, want_status, out)
        return out

    def test_agreeing_files(self):
        for r in range(3):
            self.write(r, 3, [op(s, "g%d" % s) for s in range(1, 6)])
        self.assertIn("no divergence", self.check(0))

    def test_ring_windows_differ_without_divergence(self):
        self.write(0, 2, [op(s, "g%d" % s) for s in range(1, 10)])
        self.write(1, 2, [op(s, "g%d" % s) for s in range(5, 10)])  # older ops forgotten
        self.assertIn("no divergence", self.check(0))

    def test_a_rank_that_stopped_early(self):
        self.write(0, 3, [op(s, "g%d" % s) for s in range(1, 8)] + [op(8, "g8", "running")])
        self.write(1, 3, [op(s, "g%d" % s) for s in range(1, 8)])
        self.write(2, 3, [op(s, "g%d" % s) for s in range(1, 8)] + [op(8, "g8", "failed")])
        out = self.check()
        self.assertIn("operation 8, allreduce 'g8' (float32, 1.0 KiB): rank 0 running; "
                      "rank 2 failed; rank 1 has no record of it (its last: operation 7, "
                      "allreduce 'g7' (float32, 1.0 KiB), done)", out)

    def test_different_tensors(self):
        self.write(0, 2, [op(1, "a"), op(2, "b")])
        self.write(1, 2, [op(1, "a"), op(2, "c", nbytes=8)])
        self.assertIn("operation 2: the ranks ran different tensors: rank 0 ran allreduce 'b' "
                      "(float32, 1.0 KiB); rank 1 ran allreduce 'c' (float32, 8 B)", self.check())

    def test_missing_file(self):
        self.write(0, 3, [op(1, "a")])
        self.write(2, 3, [op(1, "a")])
        self.assertIn("no file from rank 1 (dead before it could write one?)", self.check())

    def test_unsubmitted_tensor(self):
        self.write(0, 3, [op(1, "a"), op(-1, "late", "submitted")])
        self.write(1, 3, [op(1, "a")])
        self.write(2, 3, [op(1, "a"), op(-1, "late", "submitted")])
        self.assertIn("allreduce 'late' (float32, 1.0 KiB) submitted by ranks 0,2, never by "
                      "rank 1", self.check())

    def test_bad_input(self):
        with open(os.path.join(self.dir.name, "hora-flight.0.json"), "w") as f:
            f.write("{not json")
        self.assertIn("not a flight recorder file", self.check(2))


class RealJobs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.pattern = os.path.join(self.dir.name, "hora-flight.{rank}.json")

    def tool(self):
        done = subprocess.run([sys.executable, TOOL, self.dir.name], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=scaled(60))
        return done.returncode, done.stdout.decode()

    def test_stalled_tensor(self):
        """Rank 1 never submits grad.fc.weight: every rank writes its file when the stall
        shutdown fails it, and the tool names the tensor and the rank."""
        if not MPIEXEC:
            self.skipTest("built without MPI")
        cmd = [MPIEXEC] + MPI_FLAGS + [
            "-x", "HORA_STALL_WARNING_S=1", "-x", "HORA_STALL_SHUTDOWN_S=2",
            "-x", "HORA_FLIGHT_RECORDER=" + self.pattern, "-np", "3", STALL_DEMO, "skip"]
        done = subprocess.run(cmd, env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=scaled(90))
        self.assertEqual(done.returncode, 0, done.stdout.decode())
        status, out = self.tool()
        self.assertEqual(status, 1, out)
        self.assertIn("3 of 3 ranks' files", out)
        self.assertRegex(out, r"allreduce 'grad.fc.weight' \(float32, 16.0 KiB\): never "
                              r"submitted by rank 1; ranks 0,2 timeout")

    def test_sigusr1_through_horarun(self):
        """SIGUSR1 to horarun reaches every rank; each writes its file while rank 1 idles."""
        env = clean_env()
        env.update(HORA_FLIGHT_RECORDER=self.pattern, HORA_TIMEOUT_S=str(int(scaled(30))))
        job = subprocess.Popen([sys.executable, HORARUN, "-np", "2", STALL_DEMO, "idle"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            deadline = time.monotonic() + scaled(30)
            files = []
            while time.monotonic() < deadline and len(files) < 2:
                time.sleep(1)
                job.send_signal(signal.SIGUSR1)
                files = [f for f in os.listdir(self.dir.name) if f.endswith(".json")]
            out, _ = job.communicate(timeout=scaled(60))
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        self.assertEqual(len(files), 2, out.decode(errors="replace"))
        status, text = self.tool()
        self.assertIn("written because: SIGUSR1", text)
        self.assertIn("allreduce 'grad.fc.weight' (float32, 16.0 KiB) submitted by rank 0, "
                      "never by rank 1", text)
        self.assertEqual(status, 1, text)

    def test_killed_rank(self):
        """env:// world, no launcher: rank 1 is SIGKILLed; the survivors write their files."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(3):
            env = clean_env()
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE="3", HORA_TIMEOUT_S="10", HORA_FLIGHT_RECORDER=self.pattern,
                       VICTIM="1")
            procs.append(subprocess.Popen([VICTIM], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        for p in procs:
            p.wait(timeout=scaled(60))
        status, out = self.tool()
        self.assertEqual(status, 1, out)
        self.assertIn("2 of 3 ranks' files", out)
        self.assertIn("no file from rank 1", out)
        self.assertRegex(out, r"rank 0 \(.*written because: process set 0 stopped: ")


if __name__ == "__main__":
    TOOL, STALL_DEMO, VICTIM, HORARUN = (os.path.abspath(a) for a in sys.argv[1:5])
    MPIEXEC = sys.argv[5] if len(sys.argv) > 5 else None
    del sys.argv[1:6]
    unittest.main(verbosity=2)
