# SPDX-License-Identifier: Apache-2.0
"""hora.torch (horovod.torch's API) at 1, 2 and 3 ranks under horarun and mpirun
(torch_worker.py checks each result), and the Horovod-style example."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402

WORKER = os.path.join(HERE, "torch_worker.py")
EXAMPLE = os.path.abspath(os.path.join(HERE, "..", "..", "..", "bindings", "python", "examples",
                                       "train_horovod.py"))


def cases(sizes=(2, 3)):
    params = [pytest.param("horarun", n, id="horarun-%d" % n) for n in sizes]
    if "mpirun" in harness.launchers():
        params.append(pytest.param("mpirun", 2, id="mpirun-2"))
    return params


@pytest.mark.parametrize("launcher,np_", cases())
def test_horovod_api(launcher, np_):
    out = harness.run_ranks(np_, WORKER, launcher=launcher, timeout=240)
    for r in range(np_):
        assert "rank %d of %d: torch checks passed" % (r, np_) in out, out


def test_horovod_api_alone():
    """No launcher: a world of one, where every collective is the identity."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([harness.PYTHON, WORKER], env=env, timeout=harness.scaled(240),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and "rank 0 of 1: torch checks passed" in out, out


@pytest.mark.parametrize("launcher,np_", cases(sizes=(2,)))
def test_example(launcher, np_):
    out = harness.run_ranks(np_, EXAMPLE, ["--steps", "60"], launcher=launcher, timeout=240)
    assert "hora.torch: %d ranks, 60 steps" % np_ in out and "replicas identical" in out, out
