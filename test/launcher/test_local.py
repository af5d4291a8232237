# SPDX-License-Identifier: Apache-2.0
"""horarun in local mode: the environment each rank sees, and how its output comes back."""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import unittest

from launcher_util import TempDirTest, clean_env, horarun_module, rank_cmd, run_horarun


class RankEnvironment(TempDirTest):

    def run_env(self, args, env=None, np=4):
        proc, _ = run_horarun(["-np", str(np)] + args + rank_cmd("env", self.dir), env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        envs = {}
        for r in range(np):
            with open(self.path("env.%d.json" % r)) as f:
                envs[r] = json.load(f)
        return envs

    def test_torchrun_variables(self):
        envs = self.run_env([])
        ports = {e["MASTER_PORT"] for e in envs.values()}
        self.assertEqual(len(ports), 1, "every rank must name the same store")
        port = int(ports.pop())
        self.assertTrue(1024 <= port < 65536)
        for r, e in envs.items():
            self.assertEqual(e["RANK"], str(r))
            self.assertEqual(e["LOCAL_RANK"], str(r))
            self.assertEqual(e["WORLD_SIZE"], "4")
            self.assertEqual(e["LOCAL_WORLD_SIZE"], "4")
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(e["NODE_RANK"], "0")
            self.assertEqual(e["GROUP_RANK"], "0")
            self.assertEqual(e["HORA_BOOTSTRAP"], "env")
        # The port was free: nobody listens on it now either.
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        # Below the kernel's ephemeral range, where no neighbour's bind(0) or connect lands.
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            self.assertLess(port, int(f.read().split()[0]))

    def test_launcher_variables_removed(self):
        outer = {
            "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMI_RANK": "1", "PMI_SIZE": "2",
            "PMIX_RANK": "1", "PMIX_NAMESPACE": "x", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "n1",
            # Allocation-wide Slurm variables and anything else stay.
            "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n1", "HORA_TEST_KEEP": "yes",
        }
        envs = self.run_env([], env=clean_env(**outer), np=2)
        for e in envs.values():
            for name in outer:
                if name.startswith(("OMPI_", "PMI_", "PMIX_")) or name in (
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                        "SLURM_STEP_NODELIST"):
                    self.assertNotIn(name, e)
            self.assertEqual(e["SLURM_JOB_ID"], "42")
            self.assertEqual(e["SLURM_JOB_NODELIST"], "n1")
            self.assertEqual(e["HORA_TEST_KEEP"], "yes")
            self.assertEqual(e["WORLD_SIZE"], "2")

    def test_master_address_and_port_given(self):
        envs = self.run_env(["--master-addr", "127.0.0.2", "--master-port", "29123"], np=2)
        for e in envs.values():
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.2")
            self.assertEqual(e["MASTER_PORT"], "29123")

    def test_hora_knobs_and_exports(self):
        envs = self.run_env([
            "--timeline", "/tmp/tl.json", "--log-level", "debug", "--fusion-threshold", "32M",
            "--cycle-time-ms", "2.5", "--cache-capacity", "0", "--timeout", "30",
            "--cpu-backend", "gloo", "-x", "FOO=bar baz", "-x", "EMPTY=", "-x", "OUTER"],
            env=clean_env(OUTER="from-outside"), np=2)
        expected = {
            "HORA_TIMELINE": "/tmp/tl.json", "HORA_LOG_LEVEL": "debug",
            "HORA_FUSION_THRESHOLD": "32M", "HORA_CYCLE_TIME_MS": "2.5",
            "HORA_CACHE_CAPACITY": "0", "HORA_TIMEOUT_S": "30", "HORA_CPU_BACKEND": "gloo",
            "FOO": "bar baz", "EMPTY": "", "OUTER": "from-outside",
        }
        for e in envs.values():
            for name, value in expected.items():
                self.assertEqual(e.get(name), value, name)

    def test_dry_run_prints_each_rank(self):
        proc, _ = run_horarun(["-np", "2", "--nnodes", "2", "--node-rank", "1",
                               "--master-addr", "10.1.2.3", "--master-port", "29500",
                               "-x", "A=1", "--dry-run", "./prog", "arg one"],
                              env=clean_env(OMPI_COMM_WORLD_RANK="5"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 2)
        for local_rank, line in enumerate(lines):
            words = shlex.split(line)
            self.assertEqual(words[:3], ["env", "-u", "OMPI_COMM_WORLD_RANK"])
            self.assertEqual(words[-2:], ["./prog", "arg one"])
            assigned = dict(w.split("=", 1) for w in words[3:-2])
            self.assertEqual(assigned["RANK"], str(2 + local_rank))
            self.assertEqual(assigned["LOCAL_RANK"], str(local_rank))
            self.assertEqual(assigned["WORLD_SIZE"], "4")
            self.assertEqual(assigned["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(assigned["NODE_RANK"], "1")
            self.assertEqual(assigned["GROUP_RANK"], "1")
            self.assertEqual(assigned["MASTER_ADDR"], "10.1.2.3")
            self.assertEqual(assigned["MASTER_PORT"], "29500")
            self.assertEqual(assigned["A"], "1")


class PortPicks(unittest.TestCase):
    """horarun_lib/ports.py: MASTER_PORT picks that no other job on the machine can take between
    the pick and rank 0's bind, checked on a window of 6 ports."""

    WINDOW = 6

    def setUp(self):
        self.ports = horarun_module("ports")
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            self.low = int(f.read().split()[0])
        self.first = self.low - self.WINDOW  # the window: the 6 ports just below the range
        self.addCleanup(setattr, self.ports, "PORT_LOW", self.ports.PORT_LOW)
        self.ports.PORT_LOW = self.first

    def picker(self, count):
        """Another process that picks `count` ports in the window, prints them, holds them until
        its stdin closes."""
        script = textwrap.dedent("""
            import sys
            sys.path.insert(0, %r)
            import ports
            ports.PORT_LOW = %d
            print(" ".join(str(ports.free_port("127.0.0.1")) for _ in range(%d)), flush=True)
            sys.stdin.read()
        """ % (os.path.dirname(self.ports.__file__), self.first, count))
        proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)  # cleanups run last-in first-out: kill, wait, close
        return proc, [int(p) for p in proc.stdout.readline().split()]

    def test_other_jobs_picks_are_never_handed_out(self):
        window = set(range(self.first, self.low))
        other, theirs = self.picker(4)
        self.assertEqual(len(set(theirs)), 4, theirs)
        self.assertTrue(set(theirs) <= window, theirs)
        mine = [self.ports.free_port("127.0.0.1") for _ in range(2)]
        self.assertEqual(set(mine), window - set(theirs), "the two ports the other job left")
        # The window is used up: the kernel picks, in its own range.
        self.assertGreaterEqual(self.ports.free_port("127.0.0.1"), self.low)
        # The other job ends: its ports are free to pick again, by a new process (this one holds
        # its own picks for its life and does not hand them out twice).
        other.stdin.close()
        other.wait(timeout=30)
        _, again = self.picker(4)
        self.assertEqual(set(again), set(theirs))

    def test_a_port_someone_listens_on_is_skipped(self):
        listeners = []
        for port in range(self.first, self.low - 1):
            s = socket.socket()
            self.addCleanup(s.close)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken already: skipped all the same
            s.listen()
            listeners.append(s)
        _, picked = self.picker(1)
        self.assertEqual(picked, [self.low - 1])


class RankOutput(TempDirTest):
    LINES = 200

    def test_prefixed_whole_lines(self):
        proc, _ = run_horarun(["-np", "4"] + rank_cmd("output", self.LINES))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out_re = re.compile(r"^\[(\d)\] rank (\d) out (\d+) x{40}$")
        counts = {r: 0 for r in range(4)}
        tails = set()
        for line in proc.stdout.splitlines():
            m = re.match(r"^\[(\d)\] rank (\d) tail$", line)
            if m:
                self.assertEqual(m.group(1), m.group(2))
                tails.add(int(m.group(1)))
                continue
            m = out_re.match(line)
            self.assertIsNotNone(m, "mangled stdout line: %r" % line)
            self.assertEqual(m.group(1), m.group(2), line)
            counts[int(m.group(1))] += 1
        self.assertEqual(counts, {r: self.LINES for r in range(4)})
        self.assertEqual(tails, {0, 1, 2, 3}, "a last line without newline was lost")
        err_lines = proc.stderr.splitlines()
        self.assertEqual(len(err_lines), 4 * self.LINES, proc.stderr[-500:])
        for line in err_lines:
            m = re.match(r"^\[(\d)\] rank (\d) err \d+$", line)
            self.assertIsNotNone(m, "stderr line: %r" % line)
            self.assertEqual(m.group(1), m.group(2))

    def test_no_prefix(self):
        proc, _ = run_horarun(["-np", "2", "--no-prefix"] + rank_cmd("output", 5))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("[", proc.stdout + proc.stderr)
        lines = [l for l in proc.stdout.splitlines() if " out " in l]
        self.assertEqual(len(lines), 10)
        for line in lines:
            self.assertRegex(line, r"^rank \d out \d+ x{40}$")
        self.assertEqual(sorted(proc.stderr.splitlines()),
                         sorted("rank %d err %d" % (r, i) for r in range(2) for i in range(5)))

    def test_rank0_reads_stdin(self):
        proc, _ = run_horarun(["-np", "2"] + rank_cmd("stdin"), input_data="hello\n")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("[0] stdin: 'hello\\n'", proc.stdout.splitlines())
        self.assertIn("[1] stdin: ''", proc.stdout.splitlines())

    def test_all_ranks_succeed(self):
        proc, _ = run_horarun(["-np", "3"] + rank_cmd("exit", 0))
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(proc.stderr, "")


class TorchrunPrograms(TempDirTest):
    """torchrun's command lines, run: a script path without python, -m, --no-python, logs."""

    def write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)

    def rank_lines(self, text, rank):
        return [l for l in text.splitlines() if l.startswith("[%d] " % rank)]

    def test_script_path_module_and_no_python(self):
        # train.py is in the current folder, not executable, named without python: each rank
        # runs it with horarun's Python. The module, in the same folder, runs through -m.
        self.write("train.py", "import os, sys\nprint('train', os.environ['RANK'], sys.argv[1:])\n")
        self.write("pkgmod.py",
                   "import os, sys\nprint('module', os.environ['RANK'], sys.argv[1:])\n")
        self.write("tool.py", "#!/bin/sh\necho shell $RANK\n")
        os.chmod(self.path("tool.py"), 0o755)
        for args, want in [(["train.py", "--lr", "1"], "train %d ['--lr', '1']"),
                           (["-m", "pkgmod", "x"], "module %d ['x']"),
                           (["--no-python", "./tool.py"], "shell %d")]:
            proc, _ = run_horarun(["-np", "2"] + args, cwd=self.dir,
                                  env=clean_env(PYTHONPATH=self.dir))
            self.assertEqual(proc.returncode, 0, "%s: %s" % (args, proc.stderr))
            for r in range(2):
                self.assertEqual(self.rank_lines(proc.stdout, r), ["[%d] " % r + want % r], args)

    def test_log_dir_redirects_and_tee(self):
        # Rank 0: stdout to its file only, stderr to both. Rank 1: stdout to its file only,
        # stderr to the console only.
        logs = self.path("logs")
        proc, _ = run_horarun(["-np", "2", "--log-dir", logs, "--redirects", "1", "--tee", "0:2"] +
                              rank_cmd("output", 2))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.rank_lines(proc.stdout, 0) + self.rank_lines(proc.stdout, 1), [])
        for r in range(2):
            with open(os.path.join(logs, "attempt_0", str(r), "stdout.log")) as f:
                self.assertEqual(f.read(), "rank %d out 0 %s\nrank %d out 1 %s\nrank %d tail\n" % (
                    r, "x" * 40, r, "x" * 40, r))
            self.assertEqual(self.rank_lines(proc.stderr, r),
                             ["[%d] rank %d err %d" % (r, r, i) for i in range(2)])
        with open(os.path.join(logs, "attempt_0", "0", "stderr.log")) as f:
            self.assertEqual(f.read(), "rank 0 err 0\nrank 0 err 1\n")
        self.assertFalse(os.path.exists(os.path.join(logs, "attempt_0", "1", "stderr.log")))

    def test_local_ranks_filter_and_ignored_options(self):
        # torchtitan's spelling: only rank 1 on the console, every rank in the log files
        logs = self.path("logs")
        proc, _ = run_horarun(["--nproc_per_node", "2", "--local-ranks-filter", "1", "--role",
                               "rank", "--monitor-interval", "1", "--start_method", "spawn",
                               "--tee", "3", "--log_dir", logs] + rank_cmd("output", 1))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.rank_lines(proc.stdout, 0) + self.rank_lines(proc.stderr, 0), [])
        self.assertEqual(self.rank_lines(proc.stderr, 1), ["[1] rank 1 err 0"])
        with open(os.path.join(logs, "attempt_0", "0", "stderr.log")) as f:
            self.assertEqual(f.read(), "rank 0 err 0\n")

    def test_log_dir_alone_and_tee_without_one(self):
        proc, _ = run_horarun(["-np", "1", "--log_dir", self.path("all")] + rank_cmd("output", 1))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("[0] rank 0 err 0", proc.stderr)  # teed: the console still has it
        with open(self.path("all", "attempt_0", "0", "stderr.log")) as f:
            self.assertEqual(f.read(), "rank 0 err 0\n")
        proc, _ = run_horarun(["-np", "1", "-t", "1"] + rank_cmd("output", 1))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        m = re.search(r"^horarun: rank logs \(--redirects/--tee\) in (\S+)$", proc.stderr, re.M)
        self.assertTrue(m, proc.stderr)
        self.addCleanup(shutil.rmtree, m.group(1), True)
        with open(os.path.join(m.group(1), "attempt_0", "0", "stdout.log")) as f:
            self.assertTrue(f.read().startswith("rank 0 out 0 "))


if __name__ == "__main__":
    unittest.main(verbosity=2)
