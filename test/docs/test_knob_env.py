# SPDX-License-Identifier: Apache-2.0
"""hora's environment as a process sees it: Horovod's HOROVOD_* names work as aliases of the knobs,
a misspelt HORA_* variable is warned about, and no HORA_* name the project itself reads is.

Usage: test_knob_env.py HORA_INFO_BINARY KNOB_INIT_BINARY HORARUN SOURCE_ROOT"""

import os
import re
import shlex
import subprocess
import sys
import unittest

INFO = INIT = LAUNCHER = ROOT = None

# Read the sources for HORA_* names in these places (code; docs/ may name knobs that do not exist).
SCANNED = ["lib", "include", "tools", "bindings", "test", "bench", ".ci", "meson.build",
           "meson_options.txt"]
# Files that spell unknown names on purpose.
NOT_SCANNED = {"test/unit/test_knobs.cpp", "test/docs/test_knob_env.py"}
# HORA_* words in the sources that no process reads from its environment (macros, C API names and
# include guards are recognised by how they are declared; these are not).
NOT_VARIABLES = {
    "HORA_BENCH": "an argument's name in test/bench/*.sh usage lines",
    "HORA_GRADS": "an argument's name in test/bench/*.sh usage lines",
    "HORA_EXAMPLE": "an argument's name in test/timeline/check_timeline.py's usage",
    "HORA_INFO": "a global of test/docs/test_knob_docs.py (the hora-info it runs)",
    "HORA_INFO_VAR": "a constant of tools/horarun_lib/args.py; its value is HORARUN_HORA_INFO",
    "HORA_MPIRUN_ARGS": "a bash array of tools/mpirun_flags.sh (arrays are never exported)",
    "HORA_MPIRUN_BENCH_ARGS": "a bash array of tools/mpirun_flags.sh (arrays are never exported)",
    "HORA_SURELY_UNSET_VARIABLE": "test/launcher/test_usage.py needs it unset",
}
NOT_A_KNOB = "is not a hora knob"


def clean_env(**extra):
    """This environment without hora's or Horovod's variables or a launcher's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HORA", "HOROVOD_", "OMPI_", "PMI", "SLURM_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(extra)
    return env


def run(args, **extra_env):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=60, env=clean_env(**extra_env))


def table_row(stdout, knob):
    """hora-info's row of `knob`: (current value, the rest of the current column)."""
    table = stdout.split("\nknob ", 1)[1].split("\n\n", 1)[0]
    for row in table.splitlines()[1:]:
        if row.split()[0] == knob:
            return row
    raise AssertionError("no row for %s in:\n%s" % (knob, stdout))


class HoraInfo(unittest.TestCase):
    """hora-info reads the environment as hora_init does and prints what it found."""

    def test_horovod_fusion_threshold_is_the_effective_value(self):
        proc = run([INFO], HOROVOD_FUSION_THRESHOLD="1048576")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        row = table_row(proc.stdout, "HORA_FUSION_THRESHOLD")
        self.assertEqual(row.split()[1:4], ["64M", "1048576", "(from"], row)
        self.assertIn("(from HOROVOD_FUSION_THRESHOLD)", row)
        self.assertNotIn("\nwarning:", proc.stdout)

    def test_hora_wins_and_the_conflict_is_named(self):
        proc = run([INFO], HORA_FUSION_THRESHOLD="2M", HOROVOD_FUSION_THRESHOLD="1048576")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        row = table_row(proc.stdout, "HORA_FUSION_THRESHOLD")
        self.assertEqual(row.split()[2:4], ["2097152", "(set)"], row)
        self.assertIn("warning: HORA_FUSION_THRESHOLD='2M' and HOROVOD_FUSION_THRESHOLD='1048576'"
                      " are both set and differ; using HORA_FUSION_THRESHOLD\n", proc.stdout)

    def test_bad_horovod_value_names_the_horovod_variable(self):
        proc = run([INFO], HOROVOD_CYCLE_TIME="fast")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("error: HOROVOD_CYCLE_TIME='fast' is not valid: expected a number",
                      proc.stdout)

    def test_misspelt_knob_gets_the_closest_name(self):
        proc = run([INFO], HORA_FUSION_THRESHHOLD="1M", HORA_NOT_ANYTHING_OF_OURS="1")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("warning: HORA_FUSION_THRESHHOLD is not a hora knob; did you mean "
                      "HORA_FUSION_THRESHOLD?\n", proc.stdout)
        self.assertIn("warning: HORA_NOT_ANYTHING_OF_OURS is not a hora knob and is ignored",
                      proc.stdout)
        row = table_row(proc.stdout, "HORA_FUSION_THRESHOLD")
        self.assertEqual(row.split()[2], "67108864", "the misspelt variable set nothing")


class Init(unittest.TestCase):
    """hora_init, twice in one process (tools: test/docs/knob_init.c), in a world of one."""

    def init(self, **env):
        proc = run([INIT], HORA_BOOTSTRAP="single", **env)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("round 1: rank 0 of 1", proc.stdout)
        return proc.stderr

    def test_misspelt_knob_is_warned_about_once(self):
        err = self.init(HORA_CYCLE_TIME="2")
        lines = [l for l in err.splitlines() if NOT_A_KNOB in l]
        self.assertEqual(len(lines), 1, err)
        self.assertIn("[hora rank 0] W ", lines[0])
        self.assertTrue(lines[0].endswith(
            "HORA_CYCLE_TIME is not a hora knob; did you mean HORA_CYCLE_TIME_MS?"), lines[0])

    def test_horovod_log_level_and_hierarchical(self):
        # HOROVOD_LOG_LEVEL=info lets the info line through; without it, it stays quiet.
        err = self.init(HOROVOD_LOG_LEVEL="INFO", HOROVOD_HIERARCHICAL_ALLGATHER="1")
        lines = [l for l in err.splitlines()
                 if "HOROVOD_HIERARCHICAL_ALLGATHER=1 changes nothing" in l]
        self.assertEqual(len(lines), 1, err)
        self.assertIn(" I ", lines[0])
        self.assertEqual(self.init(HOROVOD_HIERARCHICAL_ALLGATHER="1"), "")

    def test_one_copy_per_host(self):
        if "env:// and slurm yes" not in run([INFO]).stdout:
            self.skipTest("built without Gloo: horarun's env:// ranks cannot start")
        proc = run([sys.executable, LAUNCHER, "-np", "2", INIT], HORA_CYCLE_TIME="2")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.count("round 1: rank"), 2, proc.stdout)
        out = proc.stdout + proc.stderr
        self.assertEqual(out.count(NOT_A_KNOB), 1, out)  # local rank 0's, once
        self.assertIn("[hora rank 0] W ", out)

    def test_bad_horovod_value_fails_init(self):
        proc = run([INIT], HORA_BOOTSTRAP="single", HOROVOD_STALL_CHECK_DISABLE="yes")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("hora_init: invalid argument: HOROVOD_STALL_CHECK_DISABLE='yes' is not "
                      "valid", proc.stdout)

    def test_unknown_cpu_plane_fails_init(self):
        # HORA_CPU_BACKEND's parser takes any plain name; the backend registry refuses one that is
        # not a plane of this build, even in a world of one, naming those it has (hora-info's).
        facts = run([INFO]).stdout
        line = [l for l in facts.splitlines() if l.strip().startswith("cpu backends:")]
        self.assertEqual(len(line), 1, facts)
        planes = [p.strip().split() for p in line[0].split(":", 1)[1].split(",")]
        built = [p[0] for p in planes if p[-1] == "yes" and len(p) == 2]  # not "self (world of one)"
        self.assertTrue(set(p[0] for p in planes) >= {"mpi", "gloo", "ucx", "self"}, line[0])
        proc = run([INIT], HORA_BOOTSTRAP="single", HORA_CPU_BACKEND="tcp")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("hora_init: invalid argument: HORA_CPU_BACKEND=tcp: not a CPU plane of this "
                      "build; it has: " + (", ".join(built) or "none"), proc.stdout)
        # A name that is not plain is the knob parser's to refuse, as before.
        proc = run([INIT], HORA_BOOTSTRAP="single", HORA_CPU_BACKEND="Gloo")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("hora_init: invalid argument: HORA_CPU_BACKEND='Gloo' is not valid",
                      proc.stdout)


class Launcher(unittest.TestCase):
    """horarun passes Horovod's variables on to the ranks of other hosts, as it does hora's."""

    def test_multi_host_exports_horovod_variables(self):
        proc = run([sys.executable, LAUNCHER, "--dry-run", "-H", "n1,n2", "--pml", "ob1", "true"],
                   HOROVOD_FUSION_THRESHOLD="1048576", HORA_CYCLE_TIME_MS="2")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        words = shlex.split(proc.stdout)
        exported = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-x"]
        self.assertIn("HOROVOD_FUSION_THRESHOLD=1048576", exported)
        self.assertIn("HORA_CYCLE_TIME_MS=2", exported)


def source_files():
    for entry in SCANNED:
        top = os.path.join(ROOT, entry)
        if os.path.isfile(top):
            yield entry
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith((".git", "build", "__pycache__"))
                       and not os.path.exists(os.path.join(folder, d, "meson-private"))
                       and d != "corpus"]
            for f in files:
                path = os.path.relpath(os.path.join(folder, f), ROOT)
                if not f.endswith((".png", ".pyc", ".md")) and path not in NOT_SCANNED:
                    yield path


def scan():
    """{HORA_* name: first file using it}, and the names declared as macros or C API names."""
    used, declared = {}, set()
    declaration = re.compile(
        r"#\s*(?:define|ifn?def|if|elif)\s+(HORA_[A-Z0-9_]+)"  # preprocessor
        r"|defined\s*\(?\s*(HORA_[A-Z0-9_]+)"
        r"|-D(HORA_[A-Z0-9_]+)"                                # meson / compiler flags
        r"|conf\.set\w*\(\s*'(HORA_[A-Z0-9_]+)'"               # hora_config.h
        r"|^\s*(HORA_[A-Z0-9_]+)\s*(?:=|,|$|/[*/])", re.M)     # enum members (in include/)
    for path in source_files():
        with open(os.path.join(ROOT, path), errors="replace") as f:
            text = f.read()
        for name in re.findall(r"\bHORA_[A-Z0-9_]*[A-Z0-9]\b", text):
            used.setdefault(name, path)
        for match in declaration.finditer(text):
            if match.group(5) is None or path.startswith("include/"):
                declared.update(g for g in match.groups() if g)
    return used, declared


class Names(unittest.TestCase):
    """Every HORA_* name read anywhere in the project is a knob or listed in lib/base/knobs.cpp's
    kOtherVariables, so that setting it never draws a 'not a hora knob' warning."""

    @classmethod
    def setUpClass(cls):
        cls.used, cls.declared = scan()
        with open(os.path.join(ROOT, "lib/base/knobs.cpp")) as f:
            knobs_cpp = f.read()

        def block(start):
            return knobs_cpp.split(start, 1)[1].split("\n};", 1)[0]

        with open(os.path.join(ROOT, "lib/base/knob_list.h")) as f:
            cls.knobs = set(re.findall(r'^HORA_KNOB(?:_SHOWN)?\("(HORA_[A-Z0-9_]+)",', f.read(),
                                       re.M))
        cls.listed = re.findall(r'^\s*\{"(HORA_[A-Z0-9_]*\*?)",', block("> kOtherVariables = {"),
                                re.M)

    def variables(self):
        return {name: path for name, path in self.used.items()
                if name not in self.declared and name not in NOT_VARIABLES}

    def is_listed(self, name):
        return any(name.startswith(l[:-1]) if l.endswith("*") else name == l for l in self.listed)

    def test_the_scan_sees_the_sources(self):
        # Names read in C++, Python, shell and meson: a scan that misses any of them is broken.
        for name in ("HORA_TEST_TIME_SCALE", "HORA_SOAK_SECONDS", "HORA_HORARUN",
                     "HORA_BUILD_JOBS", "HORA_FUZZ_CXX", "HORA_TIMEOUT_S"):
            self.assertIn(name, self.variables())
        for name in ("HORA_ERR_TIMEOUT", "HORA_LOG", "HORA_HAVE_MPI", "HORA_API", "HORA_OP_SUM"):
            self.assertIn(name, self.declared)
        self.assertGreaterEqual(len(self.knobs), 10)
        self.assertGreaterEqual(len(self.listed), 5)

    def test_every_name_is_a_knob_or_listed(self):
        missing = sorted("%s (%s)" % (name, path) for name, path in self.variables().items()
                         if name not in self.knobs and not self.is_listed(name))
        self.assertEqual(missing, [], "HORA_* names read in the sources but neither a knob nor in "
                         "kOtherVariables (lib/base/knobs.cpp): add them there, saying where they "
                         "are read")

    def test_every_listed_name_is_still_used(self):
        for listed in self.listed:
            prefix = listed.rstrip("*")
            self.assertTrue(any(n == listed or (listed.endswith("*") and n.startswith(prefix))
                                for n in self.variables()),
                            "%s is in kOtherVariables but no source reads it" % listed)

    def test_none_of_them_is_warned_about(self):
        # The real check: hora-info with every one of them set says nothing about them.
        names = {n: "1" for n in self.variables() if n not in self.knobs}
        proc = run([INFO], **names)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn(NOT_A_KNOB, proc.stdout)
        # ...while one more, not ours, is (so the check above can fail).
        names["HORA_SOAK_SECOND"] = "1"
        self.assertIn("HORA_SOAK_SECOND " + NOT_A_KNOB, run([INFO], **names).stdout)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    INFO, INIT, LAUNCHER, ROOT = (os.path.abspath(a) for a in sys.argv[1:])
    unittest.main(argv=sys.argv[:1], verbosity=2)
