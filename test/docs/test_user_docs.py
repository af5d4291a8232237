# SPDX-License-Identifier: Apache-2.0
"""What a newcomer reads: README.md and docs/*.md. Fails on the project's internal issue numbers,
on measurements said to be from "this VM" without saying what it is, on relative links to files
that do not exist (docs/NAME.md anywhere, Markdown link targets), and on a LICENSE that does not match the sources' SPDX headers.

Usage: test_user_docs.py SOURCE_ROOT"""

import glob
import os
import re
import sys
import unittest

ROOT = None

ISSUE = re.compile(r"\b(?:issues?|tasks?|PR|pull request)\s*#?\d+\b", re.I)
VAGUE_MACHINE = re.compile(r"\bthis VM\b|\bthe VM\b(?! with)", re.I)
# docs/NAME.md mentioned anywhere, and the targets of Markdown links [text](path).
DOC_REF = re.compile(r"(?<![\w/.])(docs/[A-Za-z0-9_.-]+\.(?:md|png))")
MD_LINK = re.compile(r"\]\(([^)#\s]+)")


def user_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def prose_lines(path):
    """(number, line) outside fenced code blocks: commands and program output may say anything."""
    inside = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                inside = not inside
                continue
            if not inside:
                yield number, line


class UserDocs(unittest.TestCase):
    def test_no_internal_issue_numbers(self):
        found = []
        for path in user_files():
            for number, line in prose_lines(path):
                if ISSUE.search(line) and "http" not in line:
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, line.strip()))
        self.assertEqual(found, [], "issue numbers in user-facing text:\n" + "\n".join(found))

    def test_measurements_name_their_machine(self):
        found = []
        for path in user_files():
            for number, line in prose_lines(path):
                if VAGUE_MACHINE.search(line):
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, line.strip()))
        self.assertEqual(found, [], "say what the machine is (e.g. a 2-vCPU VM):\n" + "\n".join(found))

    def test_relative_links_exist(self):
        missing = []
        for path in user_files():
            with open(path, encoding="utf-8") as f:
                text = f.read()
            here = os.path.dirname(path)
            for target in set(DOC_REF.findall(text)):
                if not os.path.exists(os.path.join(ROOT, target)):
                    missing.append("%s: %s" % (os.path.relpath(path, ROOT), target))
            for target in set(MD_LINK.findall(text)):
                if "://" in target:
                    continue
                if not os.path.exists(os.path.join(here, target)):
                    missing.append("%s: %s" % (os.path.relpath(path, ROOT), target))
        self.assertEqual(sorted(missing), [], "links to files that do not exist:\n" + "\n".join(sorted(missing)))

    def test_license_matches_the_spdx_headers(self):
        with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("Apache License", text)
        self.assertIn("Version 2.0, January 2004", text)
        ids = set()
        for pattern in ("lib/**/*.cpp", "lib/**/*.h", "include/**/*.h", "tools/*"):
            for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
                if os.path.isfile(path):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        head = f.read(400)
                    ids.update(re.findall(r"SPDX-License-Identifier: (\S+)", head))
        self.assertEqual(ids, {"Apache-2.0"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ROOT = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
