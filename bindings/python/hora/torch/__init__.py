# SPDX-License-Identifier: Apache-2.0
"""horovod.torch's API on hora: a Horovod PyTorch script runs after changing its import to

    import hora.torch as hvd

Provided: init/shutdown and the topology calls, every collective (blocking, in place, async,
grouped), sparse_allreduce_async, DistributedOptimizer (sparse gradients included),
SyncBatchNorm, broadcast_parameters, broadcast_optimizer_state, broadcast_object,
allgather_object, Compression, process sets, join, barrier, timelines. Tensors keep their dtype
(bfloat16 included) and device. Not provided: the Adasum reduction and elastic training
(hvd.elastic). hora.run (Horovod's horovod.run) is in the hora package.
"""

import hora as _hora
from hora import (HoraError, HorovodInternalError, NotInitializedError,  # noqa: F401
                  ProcessSet, add_process_set, global_process_set, is_initialized,
                  remove_process_set, shutdown, start_timeline, stop_timeline)

from . import elastic  # noqa: F401  (hvd.elastic.run, hvd.elastic.TorchState)
from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object,  # noqa: F401
                        broadcast_optimizer_state, broadcast_parameters)
from .mpi_ops import *  # noqa: F401,F403
from .optimizer import DistributedOptimizer  # noqa: F401
from .sparse import sparse_allreduce_async  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401


def init(comm=None, process_sets=None):
    """Starts hora (mpirun, horarun, torchrun variables or a world of one). `comm` (an mpi4py
    communicator or a list of ranks, in Horovod) is not supported: use process sets."""
    if comm is not None:
        raise ValueError("hora.torch.init: comm is not supported; start every rank and use "
                         "process sets (hvd.add_process_set) for subsets")
    sets = _hora.init(process_sets)
    # Horovod's join: ops other than allreduce fail while a rank of the set has joined
    set_join_mode = getattr(_hora._hora, "set_join_mode", None)  # pylint: disable=protected-access
    if set_join_mode is not None:
        set_join_mode(1)
    return sets


def _initialized(topology_call):
    """Horovod raises before init() where the core hora calls return -1."""
    if not _hora.is_initialized():
        raise NotInitializedError("hora has not been initialized; use hvd.init().", 2)
    return topology_call()


def rank():
    """This process's rank in the world. Raises (a ValueError) before init()."""
    return _initialized(_hora.rank)


def size():
    """Number of ranks in the world. Raises (a ValueError) before init()."""
    return _initialized(_hora.size)


def local_rank():
    """Rank among the ranks on this host. Raises (a ValueError) before init()."""
    return _initialized(_hora.local_rank)


def local_size():
    """Number of ranks on this host. Raises (a ValueError) before init()."""
    return _initialized(_hora.local_size)


def cross_rank():
    """Rank among the ranks with this local rank, one per host. Raises before init()."""
    return _initialized(_hora.cross_rank)


def cross_size():
    """Number of hosts with a rank of this local rank. Raises before init()."""
    return _initialized(_hora.cross_size)


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return size() == local_size() * cross_size()


def mpi_built():
    return _hora._hora.built()["mpi"]  # pylint: disable=protected-access


def gloo_built():
    return _hora._hora.built()["gloo"]  # pylint: disable=protected-access


def nccl_built():
    """The version of the NCCL hora was built with, as an int (NCCL_VERSION_CODE: 22803 for
    2.28.3), as Horovod returns it; 0 without NCCL."""
    built = _hora._hora.built()  # pylint: disable=protected-access
    if not built["nccl"]:
        return 0
    return int(built.get("nccl_version", 0)) or 1


def cuda_built():
    """Whether hora was built with its CUDA (NCCL) data plane."""
    return bool(_hora._hora.built()["nccl"])  # pylint: disable=protected-access


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
