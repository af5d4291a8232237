#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Only the knob table reads the environment in lib/.

Every HORA_* setting is a knob (lib/base/knob_list.h, knobs.cpp's table: name, default, doc, a
parser that names the variable when its value is bad) and reaches the code through `Knobs`. Whatever else
lib/ needs from the environment (a launcher's MASTER_ADDR, OMPI_* or SLURM_* variables, horarun's
HORA_AGENT_STORE, HORA_TEST_AT, another library's UCX_TLS or NCCL_SOCKET_IFNAME) goes through the
one accessor beside the table, environmentValue (lib/base/knobs.h), which refuses a knob's name.
The launch-config readers (lib/bootstrap/env/launch_config.*) take such a lookup as an argument.

So a raw read (getenv, secure_getenv, environ) in any file of lib/ but ALLOWED fails this test,
with the file and line. Comments and string literals are not code: a comment may name getenv.

usage: check_getenv.py SOURCE_ROOT
"""
import os
import re
import sys
import tempfile

ALLOWED = {"lib/base/knobs.cpp": "the knob reader and environmentValue"}
SOURCE_EXT = (".h", ".hpp", ".c", ".cpp", ".cc", ".inl", ".inc", ".cu", ".cuh")
RAW_READ = re.compile(r"\b(?:secure_getenv|getenv|__environ|environ)\b")


def code_only(text):
    """`text` with comments and string and character literals blanked (newlines kept, so line
    numbers hold)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == 'R' and text.startswith('R"', i):  # raw string: R"delim( ... )delim"
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append(c + c)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def raw_reads(root):
    """(path relative to root, line, code) for each raw environment read in root/lib outside
    ALLOWED."""
    found = []
    lib = os.path.join(root, "lib")
    for dirpath, _, files in os.walk(lib):
        for name in sorted(files):
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel in ALLOWED:
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            source = text.splitlines()
            for number, line in enumerate(code_only(text).splitlines(), 1):
                if RAW_READ.search(line):
                    found.append((rel, number, source[number - 1].strip()))
    return sorted(found)


def self_test():
    """The reader must catch what it is for, and only that: a fake lib/ with three raw reads, a
    comment and a string that name getenv, and the allowed file."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {
            "lib/core/engine.cpp": 'int a = 1;\nconst char *v = std::getenv("HORA_TIMEOUT_S");\n',
            "lib/backends/x.h": "// getenv is not used here\n/* nor\n getenv */\n"
                                'const char *s = "getenv(\\"X\\")";\nextern char **environ;\n',
            "lib/bootstrap/y.cpp": "auto v = ::secure_getenv(name);\nint getenvironment = 0;\n",
            "lib/base/knobs.cpp": 'const char *v = std::getenv("HORA_CYCLE_TIME_MS");\n',
        }
        for rel, text in files.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        got = [(rel, line) for rel, line, _ in raw_reads(tmp)]
    want = [("lib/backends/x.h", 5), ("lib/bootstrap/y.cpp", 1), ("lib/core/engine.cpp", 2)]
    assert got == want, f"self-test: the reader should find exactly {want}, it found {got}"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    self_test()
    found = raw_reads(sys.argv[1])
    for rel, line, code in found:
        print(f"{rel}:{line}: reads the environment: {code}")
    if found:
        print(f"{len(found)} raw environment read(s) in lib/: make a HORA_* setting a knob "
              "(lib/base/knobs.cpp) and pass it down in Knobs; read another variable through "
              "environmentValue (lib/base/knobs.h). Allowed: " + ", ".join(sorted(ALLOWED)))
        return 1
    print("lib/ reads the environment only in " + ", ".join(sorted(ALLOWED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
