# SPDX-License-Identifier: Apache-2.0
"""Unmodified DistributedDataParallel on "hora" and on "gloo": same seed, same data, the same
parameters; identical on every rank; and equal to one process trained on the whole batch
(checked by ddp_worker.py itself)."""

import os

import pytest
import torch

from conftest import launches, run

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.abspath(os.path.join(HERE, "..", "..", "..", "bindings", "python", "examples",
                                       "ddp.py"))


def params(out_dir, backend, dtype, rank):
    return torch.load(os.path.join(out_dir, "params_%s_%s_%d.pt" % (backend, dtype, rank)))


@pytest.mark.parametrize("launcher,np_", launches([1, 2, 3]))
def test_ddp_hora_matches_gloo(launcher, np_, tmp_path):
    for backend in ("hora", "gloo"):
        run(np_, "ddp_worker.py", ["--backend", backend, "--out", str(tmp_path)], launcher)
    first = params(tmp_path, "hora", "float32", 0)
    for rank in range(np_):
        hora_params = params(tmp_path, "hora", "float32", rank)
        gloo_params = params(tmp_path, "gloo", "float32", rank)
        assert hora_params.keys() == gloo_params.keys() == first.keys()
        for name in first:
            assert torch.equal(hora_params[name], first[name]), \
                "rank %d's %s differs from rank 0's" % (rank, name)
            assert torch.allclose(hora_params[name], gloo_params[name], rtol=1e-5, atol=1e-6), \
                "%s: hora and gloo differ by %g" % (
                    name, (hora_params[name] - gloo_params[name]).abs().max())


@pytest.mark.parametrize("dtype,hook", [("bfloat16", "none"), ("float32", "bf16")],
                         ids=["bfloat16-model", "bfloat16-comm-hook"])
def test_ddp_bfloat16_on_hora(dtype, hook, tmp_path):
    """Gloo in Debian's torch cannot reduce bfloat16; hora can: a bfloat16 model, and a float32
    one whose gradients a comm hook averages in bfloat16 (a Python callback on hora's future)."""
    run(2, "ddp_worker.py", ["--backend", "hora", "--dtype", dtype, "--hook", hook,
                             "--out", str(tmp_path)])
    tag = dtype if hook == "none" else dtype + "-" + hook
    first = params(tmp_path, "hora", tag, 0)
    second = params(tmp_path, "hora", tag, 1)
    for name in first:
        assert first[name].dtype == getattr(torch, dtype)
        assert torch.equal(first[name], second[name]), name


@pytest.mark.parametrize("backend", ["hora", "gloo"])
@pytest.mark.parametrize("launcher,np_", launches([2]))
def test_example(backend, launcher, np_):
    out = run(np_, EXAMPLE, ["--backend", backend, "--steps", "30"], launcher)
    assert "%s: %d ranks, 30 steps" % (backend, np_) in out and "replicas identical" in out, out
