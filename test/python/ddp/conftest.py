# SPDX-License-Identifier: Apache-2.0
"""Shared by the tests of the "hora" torch.distributed backend: the harness and the launches."""

import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # test/python: harness.py

import harness  # noqa: E402


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(np_, script, args=(), launcher="horarun", timeout=180):
    """Runs `script` (a file next to this one, or a path) as np_ ranks; returns all output as one
    string. Fails the test with every rank's output when a rank fails or the watchdog fires.
    Under mpirun every rank needs the same MASTER_PORT for torch's env:// store (horarun picks
    one itself); the workers take the rest from OMPI_COMM_WORLD_*."""
    path = script if os.path.isabs(script) else os.path.join(HERE, script)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()} if launcher == "mpirun" else {}
    return harness.run_ranks(np_, path, args=list(args), launcher=launcher, timeout=timeout,
                             env=env)


def launches(horarun_sizes, mpirun_sizes=(2,)):
    """pytest parameters (launcher, ranks): horarun always, mpirun when HORA_MPIEXEC is set."""
    found = harness.launchers()
    cases = [pytest.param("horarun", n, id="horarun-%d" % n) for n in horarun_sizes]
    if "mpirun" in found:
        cases += [pytest.param("mpirun", n, id="mpirun-%d" % n) for n in mpirun_sizes]
    return cases
