# SPDX-License-Identifier: Apache-2.0
"""horarun -H / --hostfile: the mpirun command it builds (--dry-run, a stand-in mpirun) and,
where Open MPI is installed, a real run on localhost."""

import os
import shlex
import shutil
import stat
import subprocess
import sys
import unittest

from launcher_util import HORARUN, TempDirTest, clean_env, run_horarun, scaled


def option_values(words, option):
    """Every value following `option` in an argument list."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == option]


def triples(words):
    """Every run of three consecutive arguments, e.g. ['--mca', 'pml', 'ucx']."""
    return [words[i:i + 3] for i in range(len(words) - 2)]


class MpirunCommand(TempDirTest):

    def dry_run(self, args, env=None):
        """The mpirun command's words; self.pml_line holds the '# pml: ...' line before it."""
        proc, _ = run_horarun(["--dry-run"] + args, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 2, proc.stdout)
        self.assertTrue(lines[0].startswith("# pml: "), proc.stdout)
        self.pml_line = lines[0]
        return shlex.split(lines[1])

    def test_host_list(self):
        words = self.dry_run(["-H", "a:4,b:4", "--pml", "ob1", "./prog", "x", "--y"])
        self.assertEqual(words[0], "mpirun")
        self.assertEqual(option_values(words, "-np"), ["8"])
        self.assertEqual(option_values(words, "--host"), ["a:4,b:4"])
        self.assertEqual(option_values(words, "--bind-to"), ["none"])
        self.assertEqual(option_values(words, "--map-by"), ["slot"])
        self.assertIn("--tag-output", words)
        self.assertNotIn("--oversubscribe", words)
        self.assertEqual(("--allow-run-as-root" in words), os.geteuid() == 0)
        self.assertEqual(option_values(words, "--mca"), ["pml", "btl"])
        self.assertIn(["--mca", "pml", "ob1"], triples(words))
        self.assertIn(["--mca", "btl", "tcp,vader,self"], triples(words))
        self.assertEqual(words[-3:], ["./prog", "x", "--y"])

    def test_exports_and_flags(self):
        env = clean_env(HORA_STALL_WARNING_S="30")
        words = self.dry_run(["-H", "n1:2,n2", "-np", "4", "--oversubscribe", "--no-prefix",
                              "--pml", "ucx", "--timeline", "/tmp/t.json", "--cpu-backend", "gloo",
                              "-x", "FOO=bar", "-x", "LD_LIBRARY_PATH=/opt/lib",
                              "--mpirun-args", "--mca btl_tcp_if_include eth0", "./prog"],
                             env=env)
        self.assertEqual(option_values(words, "-np"), ["4"])
        self.assertEqual(option_values(words, "--host"), ["n1:2,n2:1"])
        self.assertIn("--oversubscribe", words)
        self.assertNotIn("--tag-output", words)
        self.assertIn(["--mca", "pml", "ucx"], triples(words))
        self.assertNotIn("btl", option_values(words, "--mca"))
        self.assertEqual(set(option_values(words, "-x")), {
            "HORA_STALL_WARNING_S=30", "HORA_TIMELINE=/tmp/t.json", "HORA_CPU_BACKEND=gloo",
            "FOO=bar", "LD_LIBRARY_PATH=/opt/lib"})
        self.assertIn(["--mca", "btl_tcp_if_include", "eth0"], triples(words))
        self.assertEqual(words[-1], "./prog")
        self.assertLess(words.index("--mca"), words.index("./prog"))

    def test_hostfile(self):
        with open(self.path("hosts"), "w") as f:
            f.write("# the cluster\n"
                    "alpha slots=2   # two GPUs\n"
                    "\n"
                    "beta:3\n"
                    "   gamma\n"
                    "delta slots=4 max_slots=8\n")
        words = self.dry_run(["--hostfile", self.path("hosts"), "--pml", "ob1", "./prog"])
        self.assertEqual(option_values(words, "-np"), ["10"])
        self.assertEqual(option_values(words, "--host"), ["alpha:2,beta:3,gamma:1,delta:4"])

    def fake_open_mpi(self, pml_line, ucx_params=None, ucx_resources=None):
        """A stand-in mpirun (prints its arguments, exits 7) and, if pml_line, an ompi_info;
        ucx_params: (pml_ucx_tls, pml_ucx_devices) it reports (their OMPI_MCA_ variables win,
        as in Open MPI); ucx_resources: [(transport, device)] of a stand-in ucx_info -d."""
        bindir = self.path("bin")
        os.mkdir(bindir)
        scripts = {"mpirun": 'echo "fake-mpirun $*"\nexit 7\n'}
        if pml_line is not None:
            scripts["ompi_info"] = 'echo "                 MCA pml: %s"\n' % pml_line
            if ucx_params is not None:
                for name, value in zip(("pml_ucx_tls", "pml_ucx_devices"), ucx_params):
                    scripts["ompi_info"] += (
                        'echo "         MCA (-) pml ucx: parameter \\"%s\\" (current value: '
                        '\\"${OMPI_MCA_%s:-%s}\\", data source: default, level: 3 user/all, '
                        'type: string)"\n' % (name, name, value))
        if ucx_resources is not None:
            scripts["ucx_info"] = "".join(
                'echo "#      Transport: %s"\necho "#         Device: %s"\n' % r
                for r in ucx_resources)
        for name, body in scripts.items():
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return os.path.join(bindir, "mpirun")

    def test_pml_detection(self):
        ucx = self.fake_open_mpi("ucx (MCA v2.1.0, API v2.0.0, Component v4.1.4)")
        words = self.dry_run(["-H", "a:1", "--mpirun", ucx, "./prog"])
        self.assertEqual(words[0], ucx)
        self.assertEqual(option_values(words, "--mca"), ["pml"])
        self.assertIn(["--mca", "pml", "ucx"], triples(words))

    def test_pml_detection_without_ucx(self):
        mpirun = self.fake_open_mpi("ob1 (MCA v2.1.0, API v2.0.0, Component v4.1.4)")
        words = self.dry_run(["-H", "a:1", "--mpirun", mpirun, "./prog"])
        self.assertIn(["--mca", "pml", "ob1"], triples(words))
        self.assertIn(["--mca", "btl", "tcp,vader,self"], triples(words))

    # Debian 12's Open MPI 4.1 on a machine without InfiniBand: the UCX pml is built, but its
    # filter admits only InfiniBand/RoCE transports, so forcing it fails; ob1 it is.
    STOCK_TLS = ("rc_verbs,ud_verbs,rc_mlx5,dc_mlx5,ud_mlx5,cuda_ipc,rocm_ipc", "mlx*")
    ETHERNET = [("self", "memory0"), ("tcp", "lo"), ("tcp", "eth0"), ("sysv", "memory"),
                ("posix", "memory"), ("cma", "memory")]

    def test_pml_ucx_cannot_be_selected(self):
        mpirun = self.fake_open_mpi("ucx (MCA v2.1.0, API v2.0.0, Component v4.1.4)",
                                    self.STOCK_TLS, self.ETHERNET)
        words = self.dry_run(["-H", "a:2,b:2", "--mpirun", mpirun, "./prog"])
        self.assertIn(["--mca", "pml", "ob1"], triples(words))
        self.assertIn(["--mca", "btl", "tcp,vader,self"], triples(words))
        self.assertRegex(self.pml_line, r"^# pml: ob1 \(UCX's pml cannot be selected here: "
                         r"pml_ucx_tls=rc_verbs,.* UCX offers cma,posix,self,sysv,tcp\)$")

    def test_pml_ucx_with_infiniband(self):
        mpirun = self.fake_open_mpi("ucx (MCA v2.1.0)", self.STOCK_TLS,
                                    self.ETHERNET + [("rc_mlx5", "mlx5_0:1"), ("ud_verbs",
                                                                               "mlx5_0:1")])
        words = self.dry_run(["-H", "a:2,b:2", "--mpirun", mpirun, "./prog"])
        self.assertIn(["--mca", "pml", "ucx"], triples(words))
        self.assertNotIn("btl", option_values(words, "--mca"))
        self.assertIn("UCX offers rc_mlx5 on mlx5_0:1", self.pml_line)

    def test_pml_transport_without_device(self):
        # A transport passes the filter but on no device of pml_ucx_devices: UCX's pml ranks
        # below ob1 (Open MPI would pick ob1 itself).
        mpirun = self.fake_open_mpi("ucx", ("tcp,rc_verbs", "mlx*"), self.ETHERNET)
        words = self.dry_run(["-H", "a:1", "--mpirun", mpirun, "./prog"])
        self.assertIn(["--mca", "pml", "ob1"], triples(words))
        self.assertIn("no device matches pml_ucx_devices=mlx*", self.pml_line)

    def test_pml_filter_opened_by_the_user(self):
        # OMPI_MCA_pml_ucx_tls=any (in the environment or --mpirun-args) lets UCX over TCP in.
        for env, extra in (({"OMPI_MCA_pml_ucx_tls": "any", "OMPI_MCA_pml_ucx_devices": "any"},
                            []),
                           ({}, ["--mpirun-args",
                                 "--mca pml_ucx_tls any --mca pml_ucx_devices any"])):
            mpirun = self.fake_open_mpi("ucx", self.STOCK_TLS, self.ETHERNET)
            words = self.dry_run(["-H", "a:1", "--mpirun", mpirun] + extra + ["./prog"],
                                 env=clean_env(**env))
            self.assertIn(["--mca", "pml", "ucx"], triples(words))
            self.assertIn("UCX offers tcp on", self.pml_line)
            shutil.rmtree(self.path("bin"))

    def test_pml_the_user_chose(self):
        mpirun = self.fake_open_mpi("ucx", self.STOCK_TLS, self.ETHERNET)
        words = self.dry_run(["-H", "a:1", "--mpirun", mpirun, "--mpirun-args",
                              "--mca pml ucx --mca btl ^openib", "./prog"])
        self.assertEqual(option_values(words, "--mca"), ["pml", "btl"])  # theirs, once each
        self.assertEqual(self.pml_line,
                         "# pml: ucx (--mca pml in --mpirun-args; horarun adds no pml flags)")
        words = self.dry_run(["-H", "a:1", "--mpirun", mpirun, "./prog"],
                             env=clean_env(OMPI_MCA_pml="ob1"))
        self.assertNotIn("--mca", words)
        self.assertIn("OMPI_MCA_pml", self.pml_line)
        # --pml ob1 with the user's own btl list: no second --mca btl.
        words = self.dry_run(["-H", "a:1", "--mpirun", mpirun, "--pml", "ob1", "--mpirun-args",
                              "--mca btl self,tcp", "./prog"])
        self.assertEqual(option_values(words, "--mca"), ["pml", "btl"])
        self.assertIn(["--mca", "btl", "self,tcp"], triples(words))

    def test_pml_no_ucx_info(self):
        # Whether UCX's pml can be selected is unknown: no flags, Open MPI chooses (ucx where it
        # can be selected, else ob1).
        mpirun = self.fake_open_mpi("ucx", self.STOCK_TLS, None)
        env = clean_env(PATH=os.path.dirname(mpirun))
        proc = subprocess.run([sys.executable, HORARUN, "-H", "a:2", "--mpirun", mpirun,
                               "--dry-run", "./prog"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=scaled(30), check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("# pml: Open MPI's choice (ucx_info not found", proc.stdout)
        self.assertNotIn("--mca", proc.stdout.splitlines()[-1])

    def test_no_ompi_info_no_pml_flags(self):
        mpirun = self.fake_open_mpi(None)
        # PATH holds only the stand-in, so no ompi_info anywhere; horarun runs under this
        # interpreter because its shebang would search PATH for python3.
        env = clean_env(PATH=os.path.dirname(mpirun))
        proc = subprocess.run([sys.executable, HORARUN, "-H", "a:2", "--dry-run", "./prog"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=scaled(30), check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("--mca", shlex.split(proc.stdout.splitlines()[-1]))
        self.assertIn("# pml: Open MPI's choice (ompi_info not found)", proc.stdout)

    def test_runs_mpirun_and_returns_its_status(self):
        mpirun = self.fake_open_mpi("ucx")
        proc, _ = run_horarun(["-H", "a:2,b:2", "--mpirun", mpirun, "./prog", "arg"])
        self.assertEqual(proc.returncode, 7, proc.stderr)
        words = proc.stdout.split()
        self.assertEqual(words[0], "fake-mpirun")
        self.assertEqual(option_values(words, "-np"), ["4"])
        self.assertEqual(words[-2:], ["./prog", "arg"])


@unittest.skipIf(shutil.which("mpirun") is None, "Open MPI's mpirun is not installed")
class RealMpirun(TempDirTest):

    @unittest.skipUnless(os.environ.get("MPI_INIT_PROG"), "hora is built without MPI")
    def test_pml_auto(self):
        # Without --pml, hora_init's MPI_Init selects the pml horarun chose: it must be one that
        # can be selected here (on a stock Debian Open MPI without InfiniBand, a forced ucx
        # fails with "PML ucx cannot be selected").
        proc, _ = run_horarun(["-H", "localhost:2", "--oversubscribe",
                               os.environ["MPI_INIT_PROG"]], timeout=scaled(60))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.count("success"), 2, proc.stdout + proc.stderr)

    def test_localhost(self):
        script = 'echo "rank=$OMPI_COMM_WORLD_RANK t=$HORA_TIMEOUT_S x=$HORA_TEST_X"'
        proc, _ = run_horarun(["-H", "localhost:2", "--pml", "ob1", "--timeout", "17",
                               "-x", "HORA_TEST_X=5", "sh", "-c", script], timeout=scaled(60))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = sorted(l for l in proc.stdout.splitlines() if "rank=" in l)
        self.assertEqual(len(lines), 2, proc.stdout)
        for r, line in enumerate(lines):
            # --tag-output: "[jobid,rank]<stdout>:" before each line.
            self.assertRegex(line, r"^\[\d+,%d\]<stdout>:\s*rank=%d t=17 x=5$" % (r, r))


if __name__ == "__main__":
    unittest.main(verbosity=2)
