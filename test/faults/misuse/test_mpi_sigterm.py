# SPDX-License-Identifier: Apache-2.0
"""A job ended from outside. Under mpirun on the MPI plane (HORA_SHM=off, HORA_CPU_BACKEND=mpi),
rank 1 SIGKILLs itself mid-loop; mpirun ends the job by sending the others SIGTERM. Each survivor
must print one hora line naming the signal and its flight recorder file, leave that file (job id,
world size, reason), and the job must end within a bound. A lone process (a world of one) shows
the rest: it still dies of the signal itself (SIGTERM, SIGINT), and a program's own handler is
left alone.

Usage (meson): test_mpi_sigterm.py MPIEXEC SIGTERM_JOB FLIGHT_CHECK"""

import glob
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from time_scale import scaled  # noqa: E402

MPIEXEC = JOB = CHECK = None
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1",
             "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]
STEP = 20  # the victim's last step: every rank completes steps 0..19


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "SLURM_", "HORA_",
                                 "TORCHELASTIC_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


def run_bounded(cmd, env, limit):
    """(returncode, output, seconds); kills the whole process group past `limit`."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("still running after %.0f s:\n%s" % (limit, out.decode(errors="replace")))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out.decode(errors="replace"), time.monotonic() - start


def read_flight(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["hora_flight_recorder"]


class MpirunEndsTheJob(unittest.TestCase):
    def test_survivors_speak_and_leave_files(self):
        with tempfile.TemporaryDirectory() as d:
            pattern = os.path.join(d, "hora-flight.{rank}.json")
            # mpirun follows its SIGTERM with SIGKILL after odls_base_sigkill_timeout (1 s by
            # default); on a loaded machine a survivor's recorder thread may not be scheduled in
            # that second, so the test gives it 3 s (mpirun waits them out even once every rank is
            # dead, so more would only slow the test; docs/faults-misuse.md).
            cmd = [MPIEXEC] + MPI_FLAGS + [
                "--mca", "odls_base_sigkill_timeout", str(int(scaled(3))),
                "-x", "HORA_SHM=off", "-x", "HORA_CPU_BACKEND=mpi",
                "-x", "HORA_FLIGHT_RECORDER=" + pattern, "-x", "VICTIM=1",
                "-x", "STEP=%d" % STEP, "-np", "3", JOB]
            status, out, took = run_bounded(cmd, clean_env(), scaled(60))
            print("mpirun ended the job in %.1f s (status %d)" % (took, status))
            self.assertNotEqual(status, 0, out)
            for r in range(3):  # the job really ran to the victim's step
                self.assertIn("rank %d: step %d" % (r, STEP), out)
            # Each survivor writes its file before it dies; its stderr line goes through mpirun's
            # output forwarding, which mpirun may close first when it is ending the job (seen
            # under load), so every line that arrived is checked, and at least one must.
            names = sorted(os.listdir(d))
            self.assertEqual(len(names), 2, (names, out))
            files, spoke = {}, 0
            for r in (0, 2):
                mine = [n for n in names if n.endswith(".%d.json" % r)]
                self.assertEqual(len(mine), 1, (r, names, out))
                name = mine[0]
                path = os.path.join(d, name)
                rec = read_flight(path)
                files[r] = rec
                self.assertEqual((rec["rank"], rec["size"]), (r, 3))
                self.assertTrue(rec["reason"].startswith("SIGTERM"), rec["reason"])
                grads = [op for op in rec["ops"] if op["name"] == "grad"]
                self.assertEqual(sum(op["state"] == "done" for op in grads), STEP, grads[-3:])
                self.assertNotIn("failed", {op["state"] for op in grads})
                m = re.search(r"hora: rank %d received SIGTERM \(pid (\d+)\); under mpirun this "
                              r"usually means another rank exited or died; flight recorder "
                              r"written to (\S+)" % r, out)
                self.assertLessEqual(len(re.findall(r"hora: rank %d received" % r, out)), 1, out)
                if m is not None:
                    spoke += 1
                    self.assertEqual(m.group(2), path)
                    self.assertEqual(rec["pid"], int(m.group(1)))
            self.assertGreaterEqual(spoke, 1, out)
            # one job id, from mpirun, in both files and both names
            self.assertEqual(files[0]["job"], files[2]["job"])
            self.assertTrue(files[0]["job"].startswith("ompi-"), files[0]["job"])
            self.assertEqual(files[0]["job_source"], "OMPI_MCA_ess_base_jobid")
            self.assertEqual(sorted(os.listdir(d)), sorted(
                "hora-flight.%s.%d.json" % (files[0]["job"], r) for r in (0, 2)))
            done = subprocess.run([sys.executable, CHECK, d], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=scaled(60))
            text = done.stdout.decode()
            self.assertEqual(done.returncode, 1, text)
            self.assertIn("job %s, 2 of 3 ranks' files" % files[0]["job"], text)
            self.assertIn("no file from rank 1; every file here was written on SIGTERM", text)
            # A bound on the whole job: start, 20 steps, the kill, mpirun's SIGTERM, the dumps.
            self.assertLess(took, scaled(20), out)


class LoneProcess(unittest.TestCase):
    """A world of one that loops forever: signalled from here, with nothing between."""

    def start(self, d, extra=None, want=(b"step",)):
        env = clean_env()
        env.update(HORA_FLIGHT_RECORDER=os.path.join(d, "f.{rank}.json"), VICTIM="-1")
        env.update(extra or {})
        proc = subprocess.Popen([JOB], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.addCleanup(lambda: (proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL),
                                 proc.wait()))
        # Until every wanted line came (past init: in the loop), bounded: select, then raw reads.
        deadline = time.monotonic() + scaled(20)
        text = b""
        fd = proc.stdout.fileno()
        while not all(w in text for w in want):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            text += chunk
        m = re.search(rb"child (\d+)\n", text)
        if m:
            self.child = int(m.group(1))
            self.addCleanup(lambda pid=self.child: self.gone(pid) or os.kill(pid, 9))
        self.assertIn(b"rank 0: step %d\n" % STEP, text)
        self.early = text.decode(errors="replace")
        return proc

    def signal_and_wait(self, proc, signo):
        start = time.monotonic()
        proc.send_signal(signo)
        try:
            out, _ = proc.communicate(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("no exit within 10 s of signal %d" % signo)
        return self.early + out.decode(errors="replace"), time.monotonic() - start

    def test_dies_of_the_same_signal(self):
        for signo, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                proc = self.start(d)
                out, took = self.signal_and_wait(proc, signo)
                self.assertEqual(proc.returncode, -signo, out)  # the exit status a plain kill gives
                m = re.search(r"hora: rank 0 received %s \(pid %d\); .* flight recorder written "
                              r"to (\S+)" % (name, proc.pid), out)
                self.assertIsNotNone(m, out)
                rec = read_flight(m.group(1))
                self.assertTrue(rec["reason"].startswith(name), rec["reason"])
                self.assertEqual(rec["job_source"].split(" ")[0], "run")  # no launcher: drawn
                self.assertRegex(rec["job"], r"^[0-9a-f]{12}$")
                self.assertEqual(os.path.basename(m.group(1)), "f.%s.0.json" % rec["job"])
                self.assertLess(took, scaled(3), out)
                print("%s: dead %.2f s after the signal" % (name, took))

    def test_recorder_off_still_dies_and_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            proc = self.start(d, {"HORA_FLIGHT_RECORDER": "off"})
            out, _ = self.signal_and_wait(proc, signal.SIGTERM)
            self.assertEqual(proc.returncode, -signal.SIGTERM, out)
            self.assertIn("hora: rank 0 received SIGTERM; under mpirun this usually means "
                          "another rank exited or died; no flight recorder file", out)
            self.assertEqual(os.listdir(d), [])

    def test_forked_child_dies_plainly(self):
        """A child forked after hora_init is not a rank: SIGTERM ends it with no hora line and
        no file (and its parent, the rank, is untouched)."""
        with tempfile.TemporaryDirectory() as d:
            proc = self.start(d, {"FORK_CHILD": "1"}, want=(b"child", b"step"))
            child = self.child
            os.kill(child, signal.SIGTERM)
            deadline = time.monotonic() + scaled(5)
            while time.monotonic() < deadline and not self.gone(child):
                time.sleep(0.05)
            self.assertTrue(self.gone(child), "the child outlived SIGTERM")
            time.sleep(0.3)  # a wrongly woken parent would have written its file by now
            self.assertIsNone(proc.poll())
            self.assertEqual(os.listdir(d), [])
            out, _ = self.signal_and_wait(proc, signal.SIGTERM)
            self.assertEqual(proc.returncode, -signal.SIGTERM, out)
            self.assertEqual(re.findall(r"hora: rank 0 received SIGTERM \(pid (\d+)\)", out),
                             [str(proc.pid)], out)
            self.assertEqual(len(os.listdir(d)), 1)

    @staticmethod
    def gone(pid):
        """Dead: no such process, or a zombie (its parent, the job, does not reap it)."""
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().split(")")[-1].split()[0] == "Z"
        except OSError:
            return True

    def test_programs_own_disposition_is_left_alone(self):
        with tempfile.TemporaryDirectory() as d:
            proc = self.start(d, {"IGNORE_SIGTERM": "1"})
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            self.assertIsNone(proc.poll(), "SIGTERM was ignored by the program, not by hora")
            proc.kill()
            out, _ = proc.communicate(timeout=scaled(10))
            self.assertNotIn("hora: rank 0 received", self.early + out.decode(errors="replace"))
            self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    MPIEXEC, JOB, CHECK = sys.argv[1:4]
    JOB = os.path.abspath(JOB)
    del sys.argv[1:4]
    unittest.main(verbosity=2)
