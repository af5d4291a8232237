# SPDX-License-Identifier: Apache-2.0
"""Shared by the tests of the "hora" torch.distributed backend: the harness and the launches."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # test/python: harness.py

import harness  # noqa: E402


def run(np_, script, args=(), launcher="horarun", timeout=180):
    """Runs `script` (a file next to this one, or a path) as np_ ranks; returns all output as one
    string. Fails the test with every rank's output when a rank fails or the watchdog fires.
    Under a plain mpirun nothing sets torch's RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT:
    importing hora.distributed fills them from hora's MPI world (what these tests check too)."""
    path = script if os.path.isabs(script) else os.path.join(HERE, script)
    if launcher == "mpirun":
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
            os.environ.pop(name, None)  # the caller's must not reach the ranks
    return harness.run_ranks(np_, path, args=list(args), launcher=launcher, timeout=timeout)


def launches(horarun_sizes, mpirun_sizes=(2,)):
    """pytest parameters (launcher, ranks): horarun always, mpirun when HORA_MPIEXEC is set."""
    found = harness.launchers()
    cases = [pytest.param("horarun", n, id="horarun-%d" % n) for n in horarun_sizes]
    if "mpirun" in found:
        cases += [pytest.param("mpirun", n, id="mpirun-%d" % n) for n in mpirun_sizes]
    return cases
