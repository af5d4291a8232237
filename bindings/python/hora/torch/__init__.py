# SPDX-License-Identifier: Apache-2.0
"""horovod.torch's API on hora: a Horovod PyTorch script runs after changing its import to

    import hora.torch as hvd

Provided: init/shutdown and the topology calls, every collective (blocking, in place, async,
grouped), DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object, Compression, process sets, join, barrier, timelines.
Tensors keep their dtype (bfloat16 included) and device. Not provided: the Adasum reduction,
SyncBatchNorm, elastic training (hvd.elastic) and sparse allreduce (sparse gradients are reduced
dense with sparse_as_dense=True).
"""

import hora as _hora
from hora import (HoraError, HorovodInternalError, ProcessSet, add_process_set,  # noqa: F401
                  cross_rank, cross_size, global_process_set, is_initialized, local_rank,
                  local_size, rank, remove_process_set, shutdown, size, start_timeline,
                  stop_timeline)

from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object,  # noqa: F401
                        broadcast_optimizer_state, broadcast_parameters)
from .mpi_ops import *  # noqa: F401,F403
from .optimizer import DistributedOptimizer  # noqa: F401


def init(comm=None, process_sets=None):
    """Starts hora (mpirun, horarun, torchrun variables or a world of one). `comm` (an mpi4py
    communicator or a list of ranks, in Horovod) is not supported: use process sets."""
    if comm is not None:
        raise ValueError("hora.torch.init: comm is not supported; start every rank and use "
                         "process sets (hvd.add_process_set) for subsets")
    return _hora.init(process_sets)


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return size() == local_size() * cross_size()


def mpi_built():
    return _hora._hora.built()["mpi"]  # pylint: disable=protected-access


def gloo_built():
    return _hora._hora.built()["gloo"]  # pylint: disable=protected-access


def nccl_built():
    """Horovod returns the NCCL version as an int when built with it; hora returns 1 or 0."""
    return int(_hora._hora.built()["nccl"])  # pylint: disable=protected-access


def cuda_built():
    return bool(nccl_built())


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def mpi_enabled():
    """Whether this job formed its world through MPI (started by mpirun)."""
    import os  # pylint: disable=import-outside-toplevel
    return mpi_built() and "OMPI_COMM_WORLD_RANK" in os.environ


def gloo_enabled():
    return gloo_built() and not mpi_enabled()


def mpi_threads_supported():
    """hora may be called from any thread whatever the launcher: True."""
    return True
