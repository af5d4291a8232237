# SPDX-License-Identifier: Apache-2.0
"""horarun's command line: --help, --version, and exit status 2 with a clear message for bad
usage."""

import os
import stat
import subprocess
import unittest

from launcher_util import HORARUN, TempDirTest, clean_env, run_horarun


def horarun_python():
    """The interpreter horarun runs with ("#!/usr/bin/env python3"), which runs Python ranks."""
    return subprocess.run(["/usr/bin/env", "python3", "-c", "import sys; print(sys.executable)"],
                          env=clean_env(), stdout=subprocess.PIPE, text=True,
                          check=True).stdout.strip()


class Usage(TempDirTest):

    def assert_usage_error(self, args, message):
        proc, _ = run_horarun(args)
        self.assertEqual(proc.returncode, 2, "%s: %s" % (args, proc.stderr))
        self.assertIn(message, proc.stderr, args)
        self.assertEqual(proc.stdout, "", "bad usage must start nothing")

    def test_executable(self):
        self.assertTrue(os.access(HORARUN, os.X_OK), "tools/horarun must be executable")
        with open(HORARUN) as f:
            self.assertEqual(f.readline().rstrip("\n"), "#!/usr/bin/env python3")

    def test_version(self):
        proc, _ = run_horarun(["--version"])
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(proc.stdout.strip(), "horarun (hora) 0.1.0")

    def test_help_documents_everything(self):
        proc, _ = run_horarun(["--help"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for word in ["-np", "--host", "--hostfile", "--no-prefix", "--grace", "--dry-run",
                     "--timeline", "--log-level", "--fusion-threshold", "--cycle-time-ms",
                     "--cache-capacity", "--timeout", "--cpu-backend", "-x NAME", "--oversubscribe",
                     "--master-addr", "--master-port", "HORA_TIMEOUT_S", "MASTER_PORT",
                     "examples:", "horarun -np 4 ./train", "horarun -H node1:4,node2:4",
                     "-m, --module", "--no-python", "--rdzv-backend", "--rdzv-conf",
                     "--rdzv-endpoint", "--rdzv-id", "--local-addr", "--log-dir",
                     "-r N|LOCAL:N[,...], --redirects", "-t N|LOCAL:N[,...], --tee",
                     "--nproc-per-node", "--nnodes", "--node-rank", "join_timeout",
                     "last_call_timeout", "is_host", "attempt_K/RANK/stdout.log",
                     "failure summary", "sys.executable", "--local-ranks-filter",
                     "--role", "--monitor-interval", "--start-method"]:
            self.assertIn(word, proc.stdout)

    def test_no_program(self):
        self.assert_usage_error([], "no program to run")
        self.assert_usage_error(["-np", "2"], "no program to run")
        self.assert_usage_error(["-np", "2", "--"], "no program to run")

    def test_bad_rank_count(self):
        self.assert_usage_error(["-np", "0", "true"], "-np 0: need at least one rank")
        self.assert_usage_error(["-np", "-3", "true"], "-np -3: need at least one rank")
        self.assert_usage_error(["-np", "four", "true"], "invalid int value: 'four'")

    def test_bad_host_list(self):
        for hosts in ["a:x", ":4", "a:0", "a:4,,b:4", "a:4:2", "a b"]:
            self.assert_usage_error(["-H", hosts, "true"], "-H %s" % hosts)

    def test_too_many_ranks_for_the_slots(self):
        self.assert_usage_error(["-H", "a:2,b:2", "-np", "5", "true"],
                                "-np 5 is more than the 4 slots of the hosts; add --oversubscribe")

    def test_bad_hostfile(self):
        self.assert_usage_error(["--hostfile", self.path("missing"), "true"],
                                "cannot read hostfile %s" % self.path("missing"))
        with open(self.path("hosts"), "w") as f:
            f.write("a slots=2\nb cpus=3\n")
        self.assert_usage_error(["--hostfile", self.path("hosts"), "true"],
                                "hostfile %s line 2: cannot parse 'cpus=3'" % self.path("hosts"))
        with open(self.path("empty"), "w") as f:
            f.write("# nothing here\n\n")
        self.assert_usage_error(["--hostfile", self.path("empty"), "true"], "names no hosts")

    def test_conflicting_options(self):
        self.assert_usage_error(["-H", "a", "--hostfile", "f", "true"],
                                "-H and --hostfile exclude each other")
        self.assert_usage_error(["-np", "2", "--nnodes", "2", "true"],
                                "--nnodes 2 needs --master-addr and --master-port")
        self.assert_usage_error(["--nnodes", "2", "--node-rank", "2", "--master-addr", "h",
                                 "--master-port", "1", "true"], "--node-rank 2: must be in [0, 2)")

    def test_bad_options(self):
        self.assert_usage_error(["-x", "1BAD=2", "true"], "-x 1BAD=2: expected NAME=VALUE")
        self.assert_usage_error(["-x", "HORA_SURELY_UNSET_VARIABLE", "true"], "is not set")
        self.assert_usage_error(["--bogus", "true"], "unrecognized arguments: --bogus")
        self.assert_usage_error(["--cpu-backend", "Gloo", "true"],
                                "'Gloo': expected auto or a plane's name")
        self.assert_usage_error(["--cpu-backend", "", "true"], "expected auto or a plane's name")
        self.assert_usage_error(["--grace", "-1", "true"], "--grace -1: must not be negative")
        self.assert_usage_error(["--time", "3", "true"], "unrecognized arguments")

    def test_no_short_option_of_another_meaning(self):
        # -p is horovodrun's ssh port: horarun has no -p
        self.assert_usage_error(["-p", "22", "true"], "unrecognized arguments: -p")

    def test_torchrun_spellings_and_log_levels_in_any_case(self):
        proc, _ = run_horarun(["--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1",
                               "--master_addr", "10.1.2.3", "--master_port", "29511",
                               "--log-level", "INFO", "-x", "HORA_JOB_TOKEN=t", "--dry-run",
                               "true"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 2, proc.stdout)
        for local, line in enumerate(lines):
            for want in ["MASTER_ADDR=10.1.2.3", "MASTER_PORT=29511", "RANK=%d" % (2 + local),
                         "WORLD_SIZE=4", "LOCAL_RANK=%d" % local, "NODE_RANK=1",
                         "HORA_LOG_LEVEL=info"]:
                self.assertIn(" %s " % want, line)
        proc, _ = run_horarun(["--log_level", "Warning", "--dry-run", "true"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(" HORA_LOG_LEVEL=warning ", proc.stdout)

    def test_cpu_backend_is_any_plain_name(self):
        # No list of planes here: the library's registry has it, and hora_init refuses a name
        # that is not a plane of its build (test/docs/test_knob_env.py).
        for name in ["gloo", "auto", "nccl"]:
            proc, _ = run_horarun(["--cpu-backend", name, "--dry-run", "true"])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn(" HORA_CPU_BACKEND=%s " % name, proc.stdout)



class TorchrunSpellings(TempDirTest):
    """torchrun's command line, checked with --dry-run: what each rank would run."""

    def dry_run(self, args, cwd=None):
        proc, _ = run_horarun(["--dry-run"] + args, cwd=cwd)
        self.assertEqual(proc.returncode, 0, "%s: %s" % (args, proc.stderr))
        return proc

    def program_of(self, args, cwd=None):
        """The words after the variables of rank 0's line."""
        line = self.dry_run(args, cwd).stdout.splitlines()[0]
        return line.split(" HORA_JOB_TOKEN=", 1)[1].split(" ", 1)[1]

    def write(self, name, text, executable=False):
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text)
        if executable:
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def test_python_scripts_run_with_horaruns_python(self):
        python = "%s -u" % horarun_python()
        self.write("train.py", "print(1)\n")
        # A bare name in this folder (not on PATH): torchrun's "torchrun train.py".
        self.assertEqual(self.program_of(["-np", "2", "train.py", "--lr", "1"], cwd=self.dir),
                         "%s train.py --lr 1" % python)
        # Without .py: not executable, or no "#!" line to run it by.
        plain = self.write("train", "print(1)\n")
        self.assertEqual(self.program_of([plain]), "%s %s" % (python, plain))
        noshebang = self.write("job", "print(1)\n", executable=True)
        self.assertEqual(self.program_of([noshebang]), "%s %s" % (python, noshebang))
        pyshebang = self.write("job2", "#!/usr/bin/env python3\nprint(1)\n")
        self.assertEqual(self.program_of([pyshebang]), "%s %s" % (python, pyshebang))

    def test_executables_run_as_they_are(self):
        script = self.write("run.sh", "#!/bin/sh\necho hi\n", executable=True)
        self.assertEqual(self.program_of([script, "a"]), "%s a" % script)
        self.assertEqual(self.program_of(["run.sh"], cwd=self.dir), "./run.sh")
        self.assertEqual(self.program_of(["true"]), "true")
        # Another interpreter's script without the execute bit is not given to Python.
        other = self.write("other.sh", "#!/bin/sh\necho hi\n")
        self.assertEqual(self.program_of([other]), other)

    def test_module_and_no_python(self):
        python = horarun_python()
        self.assertEqual(self.program_of(["-m", "pkg.train", "--lr", "1"]),
                         "%s -u -m pkg.train --lr 1" % python)
        self.assertEqual(self.program_of(["--module", "pkg.train"]),
                         "%s -u -m pkg.train" % python)
        self.assertEqual(self.program_of(["--no-python", "train.py", "x"]), "train.py x")
        self.assertEqual(self.program_of(["--no_python", "./a.out"]), "./a.out")
        self.assert_usage_error(["-m", "--no-python", "x"], "-m runs a module with Python, "
                                "--no-python runs no Python: use one")

    def test_missing_script(self):
        proc, _ = run_horarun(["-np", "2", self.path("nothere.py")])
        self.assertEqual(proc.returncode, 127)
        self.assertEqual(proc.stderr, "horarun: cannot start %s: No such file or directory\n"
                         % self.path("nothere.py"))

    def test_nproc_per_node_spellings(self):
        # --nproc_per_node: test_torchrun_spellings_and_log_levels_in_any_case
        self.assertEqual(len(self.dry_run(["--nproc-per-node", "3", "true"]).stdout.splitlines()),
                         3)
        cpus = len(self.dry_run(["--nproc-per-node", "cpu", "true"]).stdout.splitlines())
        self.assertEqual(cpus, os.cpu_count())
        self.assert_usage_error(["--nproc-per-node", "many", "true"],
                                "invalid int value: 'many' (or cpu, gpu, auto)")

    def test_nodes_and_master_spellings(self):
        # The underscore spellings: test_torchrun_spellings_and_log_levels_in_any_case
        out = self.dry_run(["-np", "1", "-x", "HORA_JOB_TOKEN=t", "--nnodes=2", "--node-rank=1",
                            "--master-addr", "10.0.0.9", "--master-port", "29512", "true"])
        for want in ["MASTER_ADDR=10.0.0.9", "MASTER_PORT=29512", "RANK=1", "NODE_RANK=1",
                     "WORLD_SIZE=2"]:
            self.assertIn(" %s " % want, out.stdout)

    def test_rdzv_backend(self):
        # static: the endpoint is rank 0's store, no agents
        out = self.dry_run(["-np", "2", "--nnodes", "2", "-x", "HORA_JOB_TOKEN=t",
                            "--rdzv-backend", "static", "--rdzv_endpoint=10.0.0.8:29513",
                            "true"]).stdout
        self.assertIn(" MASTER_ADDR=10.0.0.8 MASTER_PORT=29513 ", out)
        # c10d: horarun's agents
        out = self.dry_run(["--rdzv_backend", "c10d", "--rdzv_endpoint", "node1:29400",
                            "--rdzv_id", "job7", "--nnodes", "1:2", "true"]).stdout
        self.assertTrue(out.startswith("# agent: 1 workers here"), out)
        self.assertIn("store at node1:29400", out)
        # torchrun's single-host spelling: port 0 is a free port
        out = self.dry_run(["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "true"]).stdout
        self.assertIn("store served here", out)
        out = self.dry_run(["--rdzv-endpoint=localhost:0", "--rdzv-backend=static",
                            "true"]).stdout
        self.assertRegex(out, r" MASTER_ADDR=localhost MASTER_PORT=[1-9][0-9]* ")
        self.assert_usage_error(["--rdzv-backend", "etcd-v2", "true"],
                                "--rdzv-backend etcd-v2 is not supported: horarun accepts c10d "
                                "(its agents' store) and static")
        self.assert_usage_error(["--rdzv-backend", "static", "--rdzv-endpoint", "h:1",
                                 "--master-port", "2", "true"],
                                "--rdzv-endpoint h:1 and --master-port 2 disagree")

    def test_rdzv_conf(self):
        out = self.dry_run(["--rdzv-backend", "c10d", "--rdzv-conf",
                            "join_timeout=60,last_call_timeout=0.5", "true"]).stdout
        self.assertIn("join timeout 60 s, last call 0.5 s", out)
        proc = self.dry_run(["--rdzv_conf", "close_timeout=5", "--rdzv-backend", "c10d", "true"])
        self.assertIn("horarun: --rdzv-conf close_timeout=5: horarun's store has no such "
                      "setting; ignored", proc.stderr)
        self.assert_usage_error(["--rdzv-conf", "frobnicate=1", "true"],
                                "--rdzv-conf frobnicate: unknown key")
        self.assert_usage_error(["--rdzv-conf", "join_timeout=-1", "true"],
                                "join_timeout=-1: expected seconds above 0")
        self.assert_usage_error(["--rdzv-conf", "is_host=maybe", "true"],
                                "is_host=maybe: expected true or false")

    def test_local_addr(self):
        self.dry_run(["--local_addr", "10.0.0.7", "true"])
        self.assert_usage_error(["--local-addr", "a b", "true"], "--local-addr a b: expected")

    def test_log_options_refused_clearly(self):
        for args, message in [
                (["--tee", "0:x", "true"], "--tee 0:x: expected 0 (none), 1 (stdout)"),
                (["-r", "a:1", "true"], "--redirects a:1: expected N or LOCAL_RANK:N"),
                (["-H", "a", "--log-dir", "d", "true"], "under mpirun use --mpirun-args"),
        ]:
            self.assert_usage_error(args, message)

    assert_usage_error = Usage.assert_usage_error


if __name__ == "__main__":
    unittest.main(verbosity=2)
