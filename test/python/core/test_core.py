# SPDX-License-Identifier: Apache-2.0
"""The `hora` package: every binding at 1, 2 and 3 ranks under horarun and mpirun
(core_worker.py computes and checks each result), and its pieces that need no world."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402

WORKER = os.path.join(HERE, "core_worker.py")


def cases():
    found = harness.launchers()
    params = [pytest.param("horarun", n, id="horarun-%d" % n) for n in (2, 3)]
    if "mpirun" in found:
        params.append(pytest.param("mpirun", 2, id="mpirun-2"))
    return params


@pytest.mark.parametrize("launcher,np_", cases())
def test_every_binding(launcher, np_, tmp_path):
    out = harness.run_ranks(np_, WORKER, [str(tmp_path)], launcher=launcher, timeout=180)
    for r in range(np_):
        assert "rank %d of %d: core checks passed" % (r, np_) in out, out


def test_world_of_one(tmp_path):
    """No launcher: hora.init() makes a world of one."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([harness.PYTHON, WORKER, str(tmp_path)], env=env,
                          timeout=harness.scaled(120), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and "rank 0 of 1: core checks passed" in out, out


def test_error_classes():
    import hora
    assert hora.error_class(4) is hora.MismatchError
    assert hora.error_class(99) is hora.HoraError
    for status in range(1, 11):
        cls = hora.error_class(status)
        assert issubclass(cls, hora.HoraError) and issubclass(cls, RuntimeError)
        assert cls.status == status
        assert hora._hora.status_string(status) != ""  # pylint: disable=protected-access
    assert issubclass(hora.InvalidArgumentError, ValueError)
    assert issubclass(hora.HoraTimeoutError, TimeoutError)
    assert str(hora.HoraTimeoutError("waited", 6)) == "waited"
    assert hora.HorovodInternalError is hora.HoraError
    e = hora.MismatchError("ranks disagree", 4)
    assert str(e) == "ranks disagree" and e.status == 4


def test_without_init():
    import numpy as np
    import hora
    assert not hora.is_initialized() and hora.size() == -1
    with pytest.raises(hora.NotInitializedError):
        hora.allgather(np.ones(2))
    with pytest.raises(TypeError, match="__dlpack__"):
        hora.allreduce_([1, 2, 3])
    hora.shutdown()  # nothing to shut down: a no-op, as in Horovod
