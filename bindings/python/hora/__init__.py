# SPDX-License-Identifier: Apache-2.0
"""hora: collective communication for data-parallel training, from Python.

    import hora, numpy as np
    hora.init()                                   # mpirun, horarun, torchrun or a world of one
    total = hora.allreduce(np.ones(4, np.float32), op=hora.Sum)
    handle = hora.allgather_async(np.full((2, 3), hora.rank()))
    rows = handle.wait()

Tensors are numpy arrays, torch tensors (any dtype, bfloat16 included; CPU, or CUDA with NCCL)
or any DLPack producer. Failures raise hora.HoraError subclasses (hora.MismatchError, ...) with
hora's message. PyTorch users: hora.torch (Horovod's API) and hora.distributed (the "hora"
torch.distributed backend). hora.run(fn, np=N) runs a function on N local ranks and returns
their results, as horovod.run does.
"""

import atexit as _atexit
import os as _os

from . import _hora
from . import _launch
from . import elastic  # noqa: F401  (hora.elastic.run, ObjectState)
from .errors import *  # noqa: F401,F403  (the exception classes are part of the API)
from .errors import HoraError, error_class
from .ops import *  # noqa: F401,F403
from .process_sets import (ProcessSet, add_process_set, global_process_set,
                           remove_process_set)
from .run import RunError, RunTimeoutError, run  # noqa: F401  (horovod.run's counterpart)

__version__ = "0.1.0"

# scripts written for Horovod catch this name
HorovodInternalError = HoraError

_exit_hook = False


def init(process_sets=None):
    """Starts hora: forms the world (Open MPI's mpirun, hora's horarun, torchrun's variables,
    Slurm, else a world of one) and the engine thread. Blocks until every rank has joined; a
    second call does nothing. `process_sets`: ProcessSets (or rank lists) to register.

    Under torchrun's variables or Slurm, hora's store keeps off torch.distributed's MASTER_PORT
    where torch is loaded, so that both can run in one process, started in either order: rank 0
    picks hora's port and passes it through torch's store (docs/torch-errors.md, "One rendezvous
    for both faces")."""
    if not _hora.is_initialized():
        _start(_launch.init_plan())
    _register_exit_hook()
    return [add_process_set(ps) for ps in (process_sets or ())]


def _register_exit_hook():
    global _exit_hook
    if not _exit_hook:
        # Horovod scripts never call shutdown: do it at exit, quietly
        _atexit.register(_shutdown_at_exit)
        _exit_hook = True


def _start(plan):
    """hora_init() as `plan` (a hora._launch.Plan) says: its variables set for the duration (then
    restored), a failure naming hora's store port completed with the plan's note, and the torch
    store it borrowed closed on every rank before any goes on."""
    wanted, borrowed = plan.wanted, plan.borrowed is not None
    saved = {name: _os.environ.get(name) for name in wanted}
    _os.environ.update(wanted)
    try:
        _hora.init()
    except HoraError as e:
        port = wanted.get("MASTER_PORT")
        if plan.note and port and ("MASTER_PORT " + port in str(e) or ":" + port in str(e)):
            raise type(e)("%s (%s)" % (e, plan.note), e.status) from None
        raise
    finally:
        for name, value in saved.items():
            if value is None:
                _os.environ.pop(name, None)
            else:
                _os.environ[name] = value
        plan.borrowed = None  # the last reference: rank 0's closes torch's store here
    if borrowed:
        _hora.barrier(0)  # no rank reaches torch's own store before rank 0 closed this one
    _register_exit_hook()


def shutdown():
    """Stops hora (collective: every rank calls it); pending ops fail with ShutDownError.
    Nothing to do if hora is not running."""
    if _hora.is_initialized():
        _hora.shutdown()


def _shutdown_at_exit():
    try:
        shutdown()
    except HoraError:
        pass  # exiting anyway; hora has logged why


def is_initialized():
    return _hora.is_initialized()


def rank():
    """This process's rank in the world (-1 before init)."""
    return _hora.rank()


def size():
    """Number of ranks in the world (-1 before init)."""
    return _hora.size()


def local_rank():
    """Rank among the ranks on this host."""
    return _hora.local_rank()


def local_size():
    """Number of ranks on this host."""
    return _hora.local_size()


def cross_rank():
    """Rank among the ranks with this local rank, one per host."""
    return _hora.cross_rank()


def cross_size():
    """Number of hosts with a rank of this local rank."""
    return _hora.cross_size()


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome-trace timeline of every op of this process to `file_path` ("{rank}" in
    it becomes the rank). `mark_cycles` is accepted for Horovod's sake; hora marks fused
    operations instead."""
    del mark_cycles
    _hora.timeline_start(str(file_path))


def stop_timeline():
    _hora.timeline_stop()
