#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The layers of lib/, checked twice: by reading every #include, and by the compiler.

    base < core < bootstrap < backends < api

A file in one layer may include its own layer's headers and those of the layers below it, nothing
above. 1) Every quoted include in lib/ is read and checked against that rule (and none may reach
around it with "lib/..." or "../"). 2) lib/layers/<layer>/, the only internal include root each
layer's library is compiled with, must link exactly the allowed folders. 3) The compiler must
refuse an upward include and accept an allowed one from each layer's include root.

usage: check_layers.py SOURCE_ROOT BUILD_ROOT CXX...
"""
import os
import re
import subprocess
import sys
import tempfile

LAYERS = ["base", "core", "bootstrap", "backends", "api"]
# One header per layer that exists and is self-contained, for the compiler check.
PROBE = {
    "base": "base/error.h",
    "core": "core/world.h",
    "bootstrap": "bootstrap/bootstrap.h",
    "backends": "backends/registry.h",
    "api": "api/runtime.h",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE_EXT = (".h", ".cpp", ".inl", ".inc", ".cu")


def allowed(layer):
    return set(LAYERS[: LAYERS.index(layer) + 1])


def check_includes(lib):
    problems = []
    folders = sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)) and d != "layers")
    for d in folders:
        if d not in LAYERS:
            problems.append(f"lib/{d}/ is not a layer: add it to LAYERS (and lib/layers/, lib/meson.build)")
    for layer in LAYERS:
        root = os.path.join(lib, layer)
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, os.path.dirname(lib))
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for target in INCLUDE.findall(text):
                    top = target.split("/", 1)[0]
                    if target.startswith("lib/") or target.startswith("../"):
                        problems.append(f'{rel}: #include "{target}" reaches around the layers')
                    elif "/" in target and top in LAYERS and top not in allowed(layer):
                        problems.append(f'{rel}: #include "{target}": {layer} may not include {top} '
                                        f'(it may include {", ".join(LAYERS[:LAYERS.index(layer) + 1])})')
    return problems


def check_roots(lib):
    problems = []
    for layer in LAYERS:
        root = os.path.join(lib, "layers", layer)
        if not os.path.isdir(root):
            problems.append(f"lib/layers/{layer}/ is missing")
            continue
        have = set(os.listdir(root))
        if have != allowed(layer):
            problems.append(f"lib/layers/{layer}/ links {sorted(have)}, expected {sorted(allowed(layer))}")
        for entry in have:
            target = os.path.realpath(os.path.join(root, entry))
            if target != os.path.realpath(os.path.join(lib, entry)):
                problems.append(f"lib/layers/{layer}/{entry} points at {target}, not lib/{entry}")
    return problems


def preprocesses(cxx, source_root, build_root, layer, header):
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(f'#include "{header}"\n')
        tu = f.name
    try:
        cmd = cxx + ["-std=c++17", "-E", "-o", os.devnull,
                     "-I", os.path.join(source_root, "lib", "layers", layer),
                     "-I", os.path.join(source_root, "include"), "-I", build_root, tu]
        done = subprocess.run(cmd, capture_output=True, text=True)
        return done.returncode == 0, done.stderr.strip().splitlines()[:1]
    finally:
        os.unlink(tu)


def check_compiler(cxx, source_root, build_root):
    problems = []
    for i, layer in enumerate(LAYERS):
        for j, other in enumerate(LAYERS):
            ok, why = preprocesses(cxx, source_root, build_root, layer, PROBE[other])
            if j <= i and not ok:
                problems.append(f'from {layer}: #include "{PROBE[other]}" should compile: {why}')
            if j > i and ok:
                problems.append(f'from {layer}: #include "{PROBE[other]}" compiled, but {other} '
                                f'is above {layer}')
    return problems


def self_test():
    """The include reader must catch what it is for: a fake lib/ with one upward include, one
    reach-around and one stray folder gives exactly those three problems."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "lib")
        files = {
            "core/a.cpp": '#include "core/a.h"\n#include "base/b.h"\n#include "backends/registry.h"\n',
            "bootstrap/b.cpp": '#include "lib/backends/x.h"\n#include <gloo/context.h>\n',
            "backends/c.cpp": '#include "bootstrap/bootstrap.h"\n#include "kernels_x86.inc"\n',
            "world/d.cpp": "",
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(lib, rel)), exist_ok=True)
            with open(os.path.join(lib, rel), "w") as f:
                f.write(text)
        got = check_includes(lib)
    want = ['lib/world/ is not a layer', 'core/a.cpp: #include "backends/registry.h"',
            'bootstrap/b.cpp: #include "lib/backends/x.h" reaches around']
    missing = [w for w in want if not any(w in g for g in got)]
    assert not missing and len(got) == len(want), (
        f"self-test: the include reader should report exactly {want}, it reported {got}")


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    source_root, build_root, cxx = sys.argv[1], sys.argv[2], sys.argv[3:]
    lib = os.path.join(source_root, "lib")
    self_test()
    problems = check_includes(lib) + check_roots(lib) + check_compiler(cxx, source_root, build_root)
    for p in problems:
        print(p)
    print(f"{len(problems)} layer problem(s)" if problems else
          f"layers hold: {' < '.join(LAYERS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
