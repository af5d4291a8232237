#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# README.md's "## Installing" section, run as written: its shell blocks in order, in a scratch copy
# of the source tree, with the VENV= and PREFIX= lines that open them pointing into scratch folders.
# Then what the section promises: the pip-installed package imports and runs from outside the
# source tree, at the version of meson.build, and hora-info says what was built for which Python.
#   test_readme_install.sh SOURCEDIR
# Cheap by default (CI: 2 cores): `meson` and `ninja` on PATH are wrappers that build at -O0 with
# -j$HORA_TEST_README_JOBS (2; meson test sets 1, as it runs this beside another test), without the
# tests, benchmarks, MPI, UCX and NCCL, and the prefix install without Python;
# where things are installed does not depend on those. HORA_TEST_README_FULL=1 runs the commands with
# the real meson and ninja alone (minutes: everything the machine has is built, twice).
set -eu
src=$(cd "$1" && pwd)
start=$(date +%s)
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! /usr/bin/python3 -c 'import mesonpy, ensurepip' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 lacks meson-python or venv's ensurepip (tools/setup.sh installs them)"
  exit 77
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
copy=$scratch/src
mkdir "$copy"
# The working tree as it is (tracked and new files, not the build folders): the README's relative
# paths and build folders resolve there, and meson-python's files land there.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -co --exclude-standard -z |
    tar -C "$src" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$copy"
else
  tar -C "$src" --exclude='./build*' --exclude='./.mesonpy*' -cf - . | tar -xf - -C "$copy"
fi

# The section's ```sh blocks, in order; VENV= and PREFIX= set at the top of theirs.
awk '/^## / { inside = ($0 == "## Installing"); next }
     inside && /^```sh$/ { code = 1; next }
     code && /^```$/ { code = 0; print ""; next }
     code { print }' "$src/README.md" >"$scratch/blocks.sh"
for var in VENV PREFIX; do
  grep -q "^$var=" "$scratch/blocks.sh" ||
    fail "README.md's Installing section no longer sets $var= in a shell block (this test substitutes it)"
done
grep -q 'pip" install' "$scratch/blocks.sh" || fail "README.md's Installing section has no pip install"
grep -q '^meson install' "$scratch/blocks.sh" || fail "README.md's Installing section has no meson install"
venv=$scratch/venv
prefix=$scratch/prefix
sed -e "s|^VENV=.*|VENV=$venv|" -e "s|^PREFIX=.*|PREFIX=$prefix|" "$scratch/blocks.sh" >"$scratch/readme.sh"

wrap=$scratch/bin
mkdir "$wrap"
if [ "${HORA_TEST_README_FULL:-0}" != 1 ]; then
  real_meson=$(command -v meson) || fail "meson not found"
  real_ninja=$(command -v ninja) || fail "ninja not found"
  cat >"$scratch/cheap.ini" <<'EOF'
[project options]
tests = 'disabled'
bench = 'disabled'
nccl = 'disabled'
mpi = 'disabled'
ucx = 'disabled'
EOF
  # meson-python's setup carries -Dwheel=true (pyproject.toml); the prefix install leaves Python out.
  cat >"$wrap/meson" <<EOF
#!/bin/sh
if [ "\${1:-}" = setup ]; then
  python=-Dpython=disabled
  for a in "\$@"; do [ "\$a" = -Dwheel=true ] && python=; done
  exec "$real_meson" "\$@" --native-file "$scratch/cheap.ini" -Doptimization=0 -Ddebug=false \$python
fi
exec "$real_meson" "\$@"
EOF
  printf '#!/bin/sh\nexec "%s" -j%s "$@"\n' "$real_ninja" "${HORA_TEST_README_JOBS:-2}" >"$wrap/ninja"
  chmod +x "$wrap/meson" "$wrap/ninja"
fi

# Nothing of the build under test or of a launcher around it may leak in.
echo "running README.md's Installing section in $copy"
(cd "$copy" && env -u PYTHONPATH -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE \
   -u OMPI_COMM_WORLD_SIZE -u HORA_BOOTSTRAP -u PIP_CONFIG_SETTINGS PATH="$wrap:$PATH" \
   bash -ex "$scratch/readme.sh") >"$scratch/readme.log" 2>&1 ||
  { cat "$scratch/readme.log" >&2; fail "a command of README.md's Installing section failed (above)"; }

# The installed package, not the source tree's, at meson.build's version.
meson_version=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$src/meson.build" | head -n 1)
got=$(cd / && env -u PYTHONPATH "$venv/bin/python" -c '
import importlib.metadata, hora, hora.distributed
print(importlib.metadata.version("hora"), hora.__file__)')
case $got in
  "$meson_version $venv/"*) ;;
  *) fail "the venv's hora is '$got', not version $meson_version from $venv" ;;
esac
info=$(cd / && "$venv/bin/hora-info")
echo "$info" | grep -q "hora package yes, for Python .*installed by pip" ||
  fail "hora-info does not report the pip-installed package: $(echo "$info" | grep python:)"
if /usr/bin/python3 -c 'import torch; assert torch.__version__.startswith("1.13")' 2>/dev/null &&
   [ -f /usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp ]; then
  echo "$info" | grep -q 'torch.distributed backend "hora" yes, for torch' ||
    fail "hora-info does not report the torch backend: $(echo "$info" | grep 'torch.distributed')"
fi
[ -x "$prefix/bin/hora-info" ] || fail "no hora-info in the prefix"

# "## Start here": its blocks that start jobs from the installed package (the install block is the
# one above; the C block's full build is run_main.sh's), as written, in the venv it activates.
awk '/^## / { inside = ($0 == "## Start here"); next }
     inside && /^```sh$/ { code = 1; block = ""; next }
     code && /^```$/ { code = 0; if (block !~ /pip|meson|mpirun|setup\.sh/) printf "%s", block; next }
     code { block = block $0 "\n" }' "$src/README.md" >"$scratch/start.sh"
grep -q '^horarun ' "$scratch/start.sh" || fail "README.md's Start here section starts no job with horarun"
(cd "$copy" && . "$venv/bin/activate" && env -u PYTHONPATH -u MASTER_ADDR -u MASTER_PORT -u RANK \
   -u WORLD_SIZE -u OMPI_COMM_WORLD_SIZE -u HORA_BOOTSTRAP bash -ex "$scratch/start.sh") \
  >"$scratch/start.log" 2>&1 ||
  { cat "$scratch/start.log" >&2; fail "a command of README.md's Start here section failed (above)"; }
grep -c 'replicas identical' "$scratch/start.log" | grep -qx "$(grep -c '^horarun ' "$scratch/start.sh")" ||
  { cat "$scratch/start.log" >&2; fail "a job of README.md's Start here section did not end with identical replicas"; }

grep '^+ ' "$scratch/readme.log" "$scratch/start.log" | grep -v '^+ VENV=\|^+ PREFIX=' | sed 's/^[^+]*+ /ran: /'
grep -E '^(\[[01]\] )?[0-9]+$|hora-example: OK|^OK' "$scratch/readme.log" || true
echo "$info" | grep 'python:\|torch.distributed'
echo "OK: README.md's Installing section and its Start here jobs ($(( $(date +%s) - start )) s)"
