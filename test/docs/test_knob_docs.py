# SPDX-License-Identifier: Apache-2.0
"""The knob list (lib/base/knob_list.h, knobs.cpp's table) is the one source of the knob docs:
README.md's knob block and horarun --help must say what hora-info generates from it.

Usage: test_knob_docs.py HORA_INFO HORARUN README.md KNOB_LIST_H"""

import difflib
import json
import os
import re
import subprocess
import sys
import unittest

HORA_INFO = HORARUN = README = KNOB_LIST = None
BEGIN, END = "<!-- knobs:begin", "<!-- knobs:end"
FIX = "regenerate it: tools/update_knob_docs.sh BUILD_DIR"


def clean_env(**extra):
    """This environment without HORA_* variables (a bad one would make hora-info exit 1)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORA")}
    env.update(extra)
    return env


def run(args, **extra_env):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=60, env=clean_env(**extra_env))


def source_names():
    """Knob names as the entries of knob_list.h spell them: read without hora-info."""
    with open(KNOB_LIST) as f:
        return re.findall(r'^HORA_KNOB(?:_SHOWN)?\("(HORA_[A-Z0-9_]+)",', f.read(), re.M)


class KnobDocs(unittest.TestCase):

    def setUp(self):
        self.names = source_names()
        self.assertGreaterEqual(len(self.names), 10, "cannot read the knobs in " + KNOB_LIST)

    def hora_info(self, *args):
        proc = run([HORA_INFO] + list(args))
        self.assertEqual(proc.returncode, 0, "hora-info %s: %s" % (" ".join(args), proc.stderr))
        return proc.stdout

    def table_rows(self):
        """hora-info's knob table: the lines after its header, up to the first blank line."""
        rows = self.hora_info().split("\nknob ", 1)[1].split("\n\n", 1)[0]
        return rows.splitlines()[1:]

    def test_hora_info_lists_the_table(self):
        self.assertEqual([r.split()[0] for r in self.table_rows()], self.names)

    def test_json_matches_the_table(self):
        knobs = json.loads(self.hora_info("--knobs-json"))
        self.assertEqual([k["name"] for k in knobs], self.names)
        # Defaults as hora-info's human table prints them (a second code path).
        shown = {}
        for row in self.table_rows():
            shown[row.split()[0]] = row.split()[1]
        for k in knobs:
            self.assertEqual(k["default"] or "unset", shown[k["name"]], k["name"])
            self.assertTrue(k["doc"] and "`" not in k["doc"], "%s: doc %r" % (k["name"], k["doc"]))

    def test_readme_block_is_generated(self):
        with open(README) as f:
            lines = f.read().split("\n")
        begins = [i for i, l in enumerate(lines) if l.startswith(BEGIN)]
        ends = [i for i, l in enumerate(lines) if l.startswith(END)]
        self.assertEqual(len(begins), 1, "README.md needs one line starting " + BEGIN)
        self.assertEqual(len(ends), 1, "README.md needs one line starting " + END)
        self.assertLess(begins[0], ends[0], END + " must follow " + BEGIN)
        readme = [l + "\n" for l in lines[begins[0] + 1:ends[0]]]
        generated = self.hora_info("--knobs-markdown").splitlines(True)
        # Every row of the table, in order, whatever else the generator gets wrong.
        rows = [l for l in generated if l.startswith("| `")]
        self.assertEqual([r.split("`")[1] for r in rows], self.names)
        if readme != generated:
            diff = "".join(difflib.unified_diff(readme, generated, "README.md (knob block)",
                                                "hora-info --knobs-markdown"))
            self.fail("README.md's knob block differs from the knob table; %s\n%s" % (FIX, diff))

    def test_horarun_help_lists_every_knob(self):
        proc = run([HORARUN, "--help"], HORARUN_HORA_INFO=HORA_INFO)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        section = proc.stdout.split("\nhora knobs (", 1)
        self.assertEqual(len(section), 2, "no knob section in horarun --help:\n" + proc.stdout)
        listed = re.findall(r"^  (HORA_[A-Z0-9_]+) \(default ", section[1], re.M)
        self.assertEqual(listed, self.names)
        self.assertIn("examples:", section[1], "the examples still end the help")

    def test_horarun_help_without_hora_info(self):
        proc = run([HORARUN, "--help"], HORARUN_HORA_INFO="/nonexistent/hora-info")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        notes = [l for l in proc.stdout.splitlines() if l.startswith("hora knobs")]
        self.assertEqual(len(notes), 1, proc.stdout)
        self.assertIn("hora-info", notes[0])
        self.assertIn("--cycle-time-ms", proc.stdout, "the rest of the help is still there")
        self.assertNotIn("HORA_BOOTSTRAP (default", proc.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    HORA_INFO, HORARUN, README, KNOB_LIST = (os.path.abspath(a) for a in sys.argv[1:])
    unittest.main(argv=sys.argv[:1], verbosity=2)
