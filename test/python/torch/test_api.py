# SPDX-License-Identifier: Apache-2.0
"""hora.torch's API where it now matches horovod.torch: sparse allreduce and sparse gradients,
SyncBatchNorm, broadcast_optimizer_state's gradients, DuplicateNameError, nccl_built, the
topology calls before init, the optimizer's _parameter_names and its process-set skip.

The multi-rank items run in one 2-rank job (api_worker.py checks each result and prints one
line per item); each test below looks for its item's line on every rank."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import harness  # noqa: E402

WORKER = os.path.join(HERE, "api_worker.py")
RANKS = 2


@pytest.fixture(scope="module")
def job():
    """The worker's output at 2 ranks; a failed job's output too (its first failed check
    ends it: the items after it are missing)."""
    try:
        return harness.run_ranks(RANKS, WORKER, launcher="horarun", timeout=120,
                                 env={"HORA_FLIGHT_RECORDER": "off"})
    except AssertionError as e:
        return str(e)


def passed(job_output, item):
    for r in range(RANKS):
        line = "api %s: ok (rank %d of %d)" % (item, r, RANKS)
        assert line in job_output, "%s missing; output:\n%s" % (line, job_output)


def test_sparse(job):
    passed(job, "sparse")


def test_sync_batch_norm(job):
    passed(job, "sync_batch_norm")


def test_broadcast_optimizer_state_gradients(job):
    passed(job, "optimizer_state_grads")


def test_duplicate_name_error(job):
    import hora
    assert issubclass(hora.DuplicateNameError, ValueError)
    assert issubclass(hora.DuplicateNameError, hora.HoraError)
    passed(job, "duplicate_name")


def test_parameter_names_and_process_set_skip(job):
    passed(job, "parameter_names_and_sets")


def test_nccl_built():
    import hora
    import hora.torch as hvd
    built = hora._hora.built()  # pylint: disable=protected-access
    version = hvd.nccl_built()
    assert type(version) is int and type(hvd.cuda_built()) is bool
    if built["nccl"]:
        # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (2.28.3: 22803); hora needs
        # NCCL 2.14 or later
        assert version == built["nccl_version"] and version >= 21400, built
        assert hvd.cuda_built()
    else:
        assert version == 0 and built["nccl_version"] == 0 and not hvd.cuda_built()


def test_rank_before_init():
    import hora
    import hora.torch as hvd
    assert not hora.is_initialized()
    for call in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank,
                 hvd.cross_size):
        with pytest.raises(ValueError, match=r"not been initialized; use hvd\.init\(\)"):
            call()
        with pytest.raises(hora.NotInitializedError):
            call()
    assert hora.rank() == -1 and hora.size() == -1  # the core API's documented answer


def test_distributed_optimizer_before_init():
    """Wrapped before hvd.init(), the optimizer would have every rank train alone with no
    error: it raises Horovod's ValueError instead, naming what to do."""
    import torch
    import hora
    import hora.torch as hvd
    assert not hora.is_initialized()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"not been initialized; call hvd\.init\(\) before"):
        hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    with pytest.raises(hora.NotInitializedError):
        hvd.DistributedOptimizer(optimizer)
