#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages hora's build and tests need. Idempotent: silent and offline when
# everything is already installed; otherwise one `apt-get update` and one `apt-get install`.
set -euo pipefail

packages=(
  meson ninja-build pkg-config gcc g++   # build
  libopenmpi-dev openmpi-bin libhwloc-dev   # MPI bootstrap and CPU backend, mpirun
  libdlpack-dev                          # DLTensor, used by the public header
  libgtest-dev                           # unit and multi-process tests
  libgloo-dev                            # Gloo: CPU backend and transport of env:// worlds
  libucx-dev ucx-utils                   # UCX: the CPU plane across hosts; ucx_perftest (bench)
  libssl-dev                             # libcrypto: HMAC-SHA256 proofs of the job token
  iproute2                               # ip netns: the two-host test on one machine
  cmake                                  # find_package(hora): the install test's outside project
  python3                                # /usr/bin/python3: run_tests.sh reads meson's testlog
  gnuplot-nox                            # hora-bench --plot: busbw against size as a PNG
  clang libclang-rt-14-dev               # libFuzzer on the control messages (test/fuzz)
  python3-dev pybind11-dev               # the Python bindings (bindings/python)
  python3-numpy python3-torch python3-pytest  # ... their tests, hora.torch and the examples
  libtorch-dev                           # the "hora" torch.distributed backend (C++ ProcessGroup)
  python3-mesonpy python3-venv           # pip install . (pyproject.toml's backend) into a venv
)

missing=()
for p in "${packages[@]}"; do
  # `dpkg -s` alone also succeeds for removed-but-not-purged packages: check the status line.
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup.sh: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup.sh: missing packages (${missing[*]}) and not root, no sudo: install them and rerun" >&2
  exit 1
fi
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup.sh: done" >&2
