# SPDX-License-Identifier: Apache-2.0
"""tools/hora-flight-check on hand-made flight recorder files, and on the files real jobs write:
a stalled tensor (HORA_STALL_SHUTDOWN_S), SIGUSR1 through horarun, and a killed rank.

Usage (meson): test_flight.py TOOL STALL_DEMO VICTIM HORARUN [MPIEXEC]"""

import json
import os
import re
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


def op(seq, name, state="done", nbytes=1024, status=None, set_id=0, at_us=1, op_id=None):
    return {"id": op_id if op_id is not None else seq + 100, "set": set_id, "seq": seq,
            "name": name, "op": "allreduce", "dtype": "float32", "bytes": nbytes, "state": state,
            "status": status or ("success" if state == "done" else "timeout"),
            "submitted_us": -1 if state == "not submitted" else at_us,
            "started_us": at_us + 1 if seq >= 0 else -1, "ended_us": at_us + 2}


S = 1000000  # microseconds in a second


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "HORA_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


class Check(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, rank, size, ops, reason="a test", job="j1", dumped_us=9, start_unix_us=0,
              host="h", pid=None, with_job=True):
        header = {"version": 1, "rank": rank, "size": size, "host": host,
                  "pid": pid if pid is not None else 100 + rank, "reason": reason,
                  "capacity": 1024, "start_unix_us": start_unix_us, "dumped_us": dumped_us,
                  "ops": ops}
        if with_job:
            header.update(job=job, job_source="test", run=job)
        name = "hora-flight.%s.%d.json" % (job, rank)
        with open(os.path.join(self.dir.name, name), "w") as f:
            json.dump({"hora_flight_recorder": header}, f)

    def check(self, want_status=1, *extra):
        done = subprocess.run([sys.executable, TOOL, self.dir.name] + list(extra),
                              stdout=subprocess.PIPE,
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
        self.assertIn("no file from rank 1 (not written, or not given here; no evidence it died)",
                      self.check())

    def test_unsubmitted_tensor(self):
        self.write(0, 3, [op(1, "a"), op(-1, "late", "submitted")])
        self.write(1, 3, [op(1, "a")])
        self.write(2, 3, [op(1, "a"), op(-1, "late", "submitted")])
        self.assertIn("allreduce 'late' (float32, 1.0 KiB) submitted by ranks 0,2; rank 1 never "
                      "submitted it (alive at its dump, 0.0 s after the others submitted)",
                      self.check())

    # Files of several jobs in one place: a 2-rank and a 3-rank job, never merged.
    def two_jobs(self, with_job=True):
        for r in range(2):
            self.write(r, 2, [op(1, "a")], job="small", dumped_us=5 * S, with_job=with_job)
        for r in range(3):
            self.write(r, 3, [op(1, "b"), op(2, "c")], job="big", dumped_us=9 * S,
                       with_job=with_job)

    def test_two_jobs_are_refused(self):
        self.two_jobs()
        out = self.check(2)
        self.assertIn("these files are from 2 different jobs", out)
        self.assertIn("job big, world size 3: ranks 0,1,2", out)
        self.assertIn("job small, world size 2: ranks 0,1", out)
        self.assertIn("pass --job ID", out)

    def test_two_jobs_one_picked(self):
        self.two_jobs()
        out = self.check(0, "--job", "small")
        self.assertIn("job small, 2 of 2 ranks' files", out)
        out = self.check(0, "--latest")
        self.assertIn("job big, 3 of 3 ranks' files", out)
        self.assertIn("2 jobs; checking the one written last", out)

    def test_old_files_of_two_sizes_are_refused(self):
        """Files without a job id (older hora) are still told apart by their world size."""
        self.two_jobs(with_job=False)
        self.assertIn("these files are from 2 different jobs", self.check(2))

    # Late, missing and dead told apart (times: the others submitted 'w' at 5 s).
    def test_late_after_a_stall_shutdown(self):
        """Rank 1 was alive when the stall shutdown failed 'w' (its own record says so) and
        submitted 'w' 30 s after the others, which a later dump of its file shows."""
        for r in (0, 2):
            self.write(r, 3, [op(1, "a"), op(2, "w", "failed", at_us=5 * S)], dumped_us=7 * S)
        self.write(1, 3, [op(1, "a"), op(2, "w", "not submitted", op_id=500),
                          op(-1, "w", "failed", status="shut down", at_us=35 * S, op_id=501)],
                   dumped_us=36 * S)
        out = self.check()
        self.assertIn("operation 2, allreduce 'w' (float32, 1.0 KiB): rank 1 submitted it 30.0 s "
                      "after the others (late); ranks 0,2 timeout", out)
        self.assertNotIn("never", out)

    def test_missing_after_a_stall_shutdown(self):
        for r in (0, 2):
            self.write(r, 3, [op(1, "a"), op(2, "w", "failed", at_us=5 * S)], dumped_us=7 * S)
        self.write(1, 3, [op(1, "a"), op(2, "w", "not submitted")], dumped_us=7 * S)
        self.assertIn("operation 2, allreduce 'w' (float32, 1.0 KiB): rank 1 never submitted it "
                      "(alive at its dump, 2.0 s after the others submitted); ranks 0,2 timeout",
                      self.check())

    def test_late_seen_in_a_later_file(self):
        """SIGUSR1 files of ranks 0,2 at 10 s show 'w' waiting; rank 1's, written at 40 s, shows
        it submitted at 35 s and run: late, not 'never'."""
        for r in (0, 2):
            self.write(r, 3, [op(1, "w", at_us=1 * S), op(-1, "w", "submitted", at_us=5 * S)],
                       dumped_us=10 * S)
        self.write(1, 3, [op(1, "w", at_us=1 * S), op(2, "w", at_us=35 * S)], dumped_us=40 * S)
        out = self.check()
        self.assertIn("allreduce 'w' (float32, 1.0 KiB) submitted by ranks 0,2; rank 1 submitted "
                      "it 30.0 s after the others (late)", out)
        self.assertNotIn("never", out)

    def test_earlier_step_of_a_recurring_name_is_not_taken_for_it(self):
        for r in (0, 2):
            self.write(r, 3, [op(1, "w", at_us=1 * S), op(-1, "w", "submitted", at_us=5 * S)],
                       dumped_us=10 * S)
        self.write(1, 3, [op(1, "w", at_us=1 * S)], dumped_us=12 * S)
        self.assertIn("rank 1 never submitted it (alive at its dump, 7.0 s after the others "
                      "submitted)", self.check())

    def test_dead_on_evidence(self):
        self.write(0, 3, [op(1, "a")], reason="process set 0 stopped: rank 1 (pid 4242) is gone "
                   "(peer lost)")
        self.write(2, 3, [op(1, "a")])
        self.assertIn("no file from rank 1: dead (rank 0's file says: process set 0 stopped: "
                      "rank 1 (pid 4242) is gone (peer lost))", self.check())

    def test_dead_old_file_and_no_process(self):
        """Rank 1's last file predates the others' 'w' and its process (here) is gone."""
        gone = subprocess.Popen(["true"])
        gone.wait()  # reaped: its pid names no process (reuse within this test is unlikely)
        for r in (0, 2):
            self.write(r, 3, [op(1, "a"), op(-1, "w", "submitted", at_us=5 * S)],
                       dumped_us=10 * S, host=socket.gethostname())
        self.write(1, 3, [op(1, "a")], dumped_us=2 * S, host=socket.gethostname(), pid=gone.pid)
        self.assertIn("rank 1 is dead (its file, written 3.0 s before the others submitted, is "
                      "its last, and pid %d is gone)" % gone.pid, self.check())

    def test_old_file_of_a_live_process_is_not_dead(self):
        for r in (0, 2):
            self.write(r, 3, [op(1, "a"), op(-1, "w", "submitted", at_us=5 * S)],
                       dumped_us=10 * S, host=socket.gethostname())
        self.write(1, 3, [op(1, "a")], dumped_us=2 * S, host=socket.gethostname(), pid=os.getpid())
        out = self.check()
        self.assertIn("rank 1: its file was written 3.0 s before the others submitted it, so it "
                      "cannot tell", out)
        self.assertNotIn("dead", out)

    def test_bad_input(self):
        with open(os.path.join(self.dir.name, "hora-flight.j1.0.json"), "w") as f:
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
        self.assertRegex(out, r"allreduce 'grad.fc.weight' \(float32, 16.0 KiB\): rank 1 never "
                              r"submitted it \(alive at its dump, [0-9.]+ s after the others "
                              r"submitted\); ranks 0,2 timeout")
        # named for mpirun's job: one id in every name and header
        job = re.search(r"job (ompi-\d+), ", out).group(1)
        self.assertEqual(sorted(os.listdir(self.dir.name)),
                         ["hora-flight.%s.%d.json" % (job, r) for r in range(3)])

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
        # every rank reports where it is, the idle one too, and rank 0 names the one it waits for
        # (its coordinator is blocked in a negotiation that rank 1 never joins: it used to print
        # nothing)
        printed = out.decode(errors="replace")
        self.assertRegex(printed, r"stall: rank 0 of process set 0 has waited .* \(SIGUSR1\); "
                                  r"not taking part: rank 1 \(alive, idle")
        self.assertIn("stall report (SIGUSR1): rank 1 of process set 0 is idle", printed)
        status, text = self.tool()
        self.assertIn("written because: SIGUSR1", text)
        self.assertIn("allreduce 'grad.fc.weight' (float32, 16.0 KiB) submitted by rank 0; "
                      "rank 1 never submitted it (alive at its dump", text)
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
        try:
            for p in procs:
                p.wait(timeout=scaled(60))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        status, out = self.tool()
        self.assertEqual(status, 1, out)
        self.assertIn("2 of 3 ranks' files", out)
        # dead on evidence: the survivors' files say rank 1 was lost
        self.assertRegex(out, r"no file from rank 1: dead \(rank [02]'s file says: process set 0 "
                              r"stopped: .*rank 1\b")
        self.assertRegex(out, r"rank 0 \(.*written because: process set 0 stopped: ")


if __name__ == "__main__":
    TOOL, STALL_DEMO, VICTIM, HORARUN = (os.path.abspath(a) for a in sys.argv[1:5])
    MPIEXEC = sys.argv[5] if len(sys.argv) > 5 else None
    del sys.argv[1:6]
    unittest.main(verbosity=2)
