# SPDX-License-Identifier: Apache-2.0
"""DistributedDataParallel on CUDA tensors: backend "hora" (hora's NCCL path) trains the same
model as backend "nccl" bit for bit, at world size 1 and, with two GPUs, 2; ddp_cuda_worker.py
also checks the backend's stream-ordered Work.wait(), its future and a mixed-device error.
Skipped where torch has no CUDA, there is no GPU, or the extension was built without CUDA."""

import os

import pytest
import torch

from conftest import run


def skip_unless_cuda(np_):
    if torch.version.cuda is None:
        pytest.skip("torch %s has no CUDA" % torch.__version__)
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if torch.cuda.device_count() < np_:
        pytest.skip("%d ranks need %d GPUs; %d here" % (np_, np_, torch.cuda.device_count()))
    import hora.distributed  # pylint: disable=import-outside-toplevel
    if not hora.distributed.CUDA:
        pytest.skip("hora's torch backend was built without CUDA (hora without NCCL?)")


@pytest.mark.parametrize("np_", [1, 2], ids=["1-rank", "2-ranks"])
def test_ddp_cuda_hora_matches_nccl(np_, tmp_path):
    skip_unless_cuda(np_)
    for backend in ("hora", "nccl"):
        out = run(np_, "ddp_cuda_worker.py", ["--backend", backend, "--out", str(tmp_path)])
        for rank in range(np_):
            assert "rank %d: DDP on %s" % (rank, backend) in out, out
    for rank in range(np_):
        hora_params = torch.load(os.path.join(tmp_path, "params_cuda_hora_%d.pt" % rank))
        nccl_params = torch.load(os.path.join(tmp_path, "params_cuda_nccl_%d.pt" % rank))
        assert hora_params.keys() == nccl_params.keys()
        for name in hora_params:
            assert torch.equal(hora_params[name], nccl_params[name]), \
                "rank %d: %s: hora and nccl differ by %g" % (
                    rank, name, (hora_params[name] - nccl_params[name]).abs().max())

