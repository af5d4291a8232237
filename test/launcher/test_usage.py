# SPDX-License-Identifier: Apache-2.0
"""horarun's command line: --help, --version, and exit status 2 with a clear message for bad
usage."""

import os
import unittest

from launcher_util import HORARUN, TempDirTest, run_horarun


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
                     "examples:", "horarun -np 4 ./train", "horarun -H node1:4,node2:4"]:
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
        self.assert_usage_error(["--cpu-backend", "nccl", "true"], "invalid choice: 'nccl'")
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
