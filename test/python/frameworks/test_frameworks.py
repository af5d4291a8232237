# SPDX-License-Identifier: Apache-2.0
"""Hugging Face Accelerate and PyTorch Lightning on the "hora" backend: a few steps at 2 ranks
under horarun, checked against one process trained on the whole batch. Skipped where the
framework is not installed (Debian packages neither); a machine with them runs
`python3 -m pytest test/python/frameworks` with the package importable (pip install .)."""

import importlib.util
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # test/python: harness.py
import harness  # noqa: E402


def devices():
    """(device, ranks): 2 ranks on the CPU; on CUDA one rank per GPU, at most 2 (NCCL refuses
    two ranks of one communicator on one GPU)."""
    found = [pytest.param("cpu", 2, id="cpu-2")]
    if torch.cuda.is_available():
        n = min(2, torch.cuda.device_count())
        found.append(pytest.param("cuda", n, id="cuda-%d" % n))
    return found


def have(*modules):
    return any(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.skipif(not have("accelerate"), reason="Hugging Face Accelerate is not installed")
@pytest.mark.parametrize("device,ranks", devices())
def test_accelerate(device, ranks):
    out = harness.run_ranks(ranks, os.path.join(HERE, "accelerate_worker.py"), [device],
                            timeout=240)
    assert out.count("parameters match one process") == ranks, out


@pytest.mark.skipif(not have("lightning", "pytorch_lightning"),
                    reason="PyTorch Lightning is not installed")
@pytest.mark.parametrize("device,ranks", devices())
def test_lightning(device, ranks):
    out = harness.run_ranks(ranks, os.path.join(HERE, "lightning_worker.py"), [device],
                            timeout=240)
    assert out.count("parameters match one process") == ranks, out
