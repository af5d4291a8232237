# SPDX-License-Identifier: Apache-2.0
"""The ``hora`` backend of torch.distributed (built and tested on torch 1.13; built for any
torch >= 1.13, but the torch 2 code is type-checked only, not yet tried).

    import torch.distributed as dist
    import hora.distributed            # registers the backend
    dist.init_process_group("hora")    # env:// as with any backend: torchrun, horarun, a
                                       # plain mpirun or srun (the import fills RANK,
                                       # WORLD_SIZE, MASTER_ADDR and MASTER_PORT from hora's
                                       # MPI world, or from Slurm's variables)
    model = torch.nn.parallel.DistributedDataParallel(model)

Each collective is one hora request, named so that hora matches it across ranks (see README,
"Using hora from Python"). The backend starts hora (``hora.init()``; under mpirun hora forms its
world through MPI) on the first group unless it runs already, and hora shuts down at exit;
hora's world must be torch's, rank for rank. Groups from ``dist.new_group`` are hora process sets.
hora.torch's ``hvd.init()`` and a torch group of any backend coexist in one process, created in
either order: hora's store keeps off torch's MASTER_PORT (hora._launch; docs/torch-errors.md).

Supported: allreduce (SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, and BAND/BOR/BXOR through an
allgather), allreduce_coalesced, reduce, broadcast, allgather, _allgather_base,
allgather_coalesced, gather, scatter, reduce_scatter, _reduce_scatter_base, alltoall,
alltoall_base, barrier; CPU tensors of uint8, int8, int16, int32, int64, float16, bfloat16,
float32, float64 and bool (SUM and MAX of bool are logical OR, PRODUCT and MIN logical AND), and
CUDA tensors through hora's NCCL backend where the extension was built with CUDA (``CUDA``
below; docs/torch-errors.md: streams and ``Work.wait()``). Not supported: send/recv (hora has
no point-to-point messages) and monitored_barrier. Errors raise
hora's exception classes (``hora.MismatchError``, ...), which are RuntimeErrors.

Ops are named by their kind and count, the same on every rank whatever the tensors, so that
ranks that disagree on a shape or dtype fail at once with hora's MismatchError naming both. The
group's ``timeout`` (``init_process_group(timeout=...)``, ``new_group(timeout=...)``) bounds
every op: one not complete that long after its call fails with hora.HoraTimeoutError naming it,
and the group with it (later ops fail at once; destroy it or restart). See docs/torch-errors.md.
"""

import atexit
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _torch_c10d

import hora
from hora import _launch

# CUDA: whether this extension takes CUDA tensors (built against a torch with CUDA and a hora
# with its NCCL backend); without it, CUDA tensors are refused with a message saying so.
from ._c10d import CUDA, ProcessGroupHora

__all__ = ["ProcessGroupHora", "BACKEND", "CUDA"]

BACKEND = "hora"

# hora process sets of the groups new_group made, by their sorted world ranks. Every rank fills
# it, members or not, since making a hora process set is collective over the world.
_process_sets = {}


def _seconds(timeout):
    """torch's timeout (a timedelta, or None) in seconds; 0 for none."""
    if timeout is None:
        return 0.0
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    return max(0.0, seconds)


def _start_hora(store, rank, size, timeout=None):
    """hora.init() on every rank of torch's world, unless hora runs already; checks that hora's
    world is torch's.

    Under env:// or Slurm, torch's store already listens on MASTER_PORT, where hora's
    rendezvous would listen too: rank 0 picks another port and tells the others through torch's
    store (hora._launch.agree_through_store). Under mpirun and horarun hora's world needs no
    port of its own. Variables torch was not given through the environment (tcp:// or file://
    init) are filled in from what it was given. The group's `timeout` plus a second becomes
    hora's HORA_STALL_SHUTDOWN_S unless that is set: the backend fails an op at the timeout
    (and its group with it), and hora fails the name a second later on the ranks that submitted
    it, which clears it from hora's negotiation. A timeout under two minutes makes
    HORA_STALL_WARNING_S half of it unless set, so that hora's warning naming the missing ranks
    comes first. The environment is restored afterwards."""
    if not hora.is_initialized():
        wanted = {}
        if _seconds(timeout) > 0:
            wanted["HORA_STALL_SHUTDOWN_S"] = "%g" % (_seconds(timeout) + 1)
            if _seconds(timeout) < 120:  # warned of at half the timeout, not after hora's 60 s
                wanted["HORA_STALL_WARNING_S"] = "%g" % (_seconds(timeout) / 2)
        wanted = {name: value for name, value in wanted.items() if name not in os.environ}
        note = ""
        kind = _launch.bootstrap_kind(os.environ)
        if kind in ("env", "slurm") or (kind == "single"
                                        and os.environ.get("HORA_BOOTSTRAP") != "single"):
            wanted.update(_launch.agree_through_store(store, rank, size, os.environ))
            note = "hora's store port, agreed through torch.distributed's store"
        hora._start(_launch.Plan(wanted, note))  # pylint: disable=protected-access
    _register_exit_hook()
    if (hora.rank(), hora.size()) != (rank, size):
        raise RuntimeError(
            "hora backend: torch's world makes this process rank %d of %d, hora's rank %d of %d; "
            "start every rank with one launcher (torchrun, horarun, or mpirun with RANK and "
            "WORLD_SIZE from OMPI_COMM_WORLD_RANK/SIZE)" % (rank, size, hora.rank(), hora.size()))


_exit_hook = False


def _register_exit_hook():
    """At exit, before hora's own hook (atexit runs the later registration first, and hora
    registers at its first init, which comes before this): hora shuts down and every group's
    threads are joined while the interpreter is whole, so none of them runs a future's callback
    or lets go of a tensor while Python finalizes (a group nobody destroyed keeps its threads)."""
    global _exit_hook
    if not _exit_hook:
        atexit.register(ProcessGroupHora._stop_all)
        _exit_hook = True


def _create_process_group(options, pg_options):
    """torch's creator for backend "hora" (extended API): called on the members of each group."""
    if pg_options is not None:
        raise RuntimeError("hora backend: it takes no pg_options")
    ranks = list(options.global_ranks_in_group)
    timeout = getattr(options, "timeout", None)
    if not ranks:  # the default group: hora's world
        _start_hora(options.store, options.group_rank, options.group_size, timeout)
        process_set = 0
    else:
        process_set = _process_sets.get(tuple(sorted(ranks)))
        if process_set is None:
            raise RuntimeError(
                "hora backend: no hora process set for ranks %s; make groups with "
                "torch.distributed.new_group, on every rank" % ranks)
    return ProcessGroupHora(options.group_rank, options.group_size, process_set,
                            options.group_id, _seconds(timeout))


_torch_new_process_group_helper = _torch_c10d._new_process_group_helper


def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store,
                              *args, **kwargs):
    """torch calls the creator on a group's members only, but a hora process set is made by the
    whole world: new_group runs this helper on every rank, so the set is made here first."""
    if global_ranks_in_group and str(backend).lower() == BACKEND:
        world = _torch_c10d._get_default_group()
        _start_hora(store, world.rank(), world.size(), kwargs.get("timeout"))
        ranks = tuple(sorted(int(r) for r in global_ranks_in_group))
        _process_sets[ranks] = hora.add_process_set(list(ranks)).process_set_id
    return _torch_new_process_group_helper(group_size, group_rank, global_ranks_in_group,
                                           backend, store, *args, **kwargs)


# Variables torch's env:// rendezvous needs, and those of an MPI launcher.
_TORCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MPI_LAUNCHER = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def _route_to(host):
    """This host's address on the route to `host`; None if there is none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            return s.getsockname()[0]
    except OSError:
        return None


def _env_from_mpi():
    """Under a plain `mpirun`, torch's env:// rendezvous would fail ("RANK expected"): nothing set
    RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT. hora forms its world through MPI anyway, so
    start it now and give torch what it lacks: the rank and size of that world, and for torch's
    store rank 0's address (127.0.0.1 when every rank is on one host) and a port free there.
    hora shuts down again afterwards (unless it ran before: hvd.init() came first), so that
    knobs set before init_process_group (and its timeout) still apply when the backend starts
    it. Collective: every rank imports this module. Variables already set are kept."""
    if not any(os.environ.get(v) for v in _MPI_LAUNCHER) or all(os.environ.get(v) for v in _TORCH_ENV):
        return
    import numpy as np

    running = hora.is_initialized()
    hora.init()
    size = hora.size()
    name = np.zeros(256, dtype=np.uint8)
    raw = socket.gethostname().encode()[:255]
    name[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    hosts = [bytes(h).rstrip(b"\0").decode() for h in
             hora.allgather(name, name="hora.distributed.env.hosts").reshape(size, 256)]
    master = np.zeros(2, dtype=np.int64)  # IPv4 address as an integer, port
    if hora.rank() == 0:
        address = "127.0.0.1"
        others = [h for h in hosts if h != hosts[0]]
        if others:
            address = _route_to(others[0]) or socket.gethostbyname(hosts[0])
        master[:] = (int.from_bytes(socket.inet_aton(address), "big"),
                     _launch._free_port())  # pylint: disable=protected-access
    hora.broadcast_(master, 0, name="hora.distributed.env.master")
    defaults = {"RANK": str(hora.rank()), "WORLD_SIZE": str(size),
                "MASTER_ADDR": socket.inet_ntoa(int(master[0]).to_bytes(4, "big")),
                "MASTER_PORT": str(int(master[1])),
                "LOCAL_RANK": str(hora.local_rank()), "LOCAL_WORLD_SIZE": str(hora.local_size())}
    if not running:
        hora.shutdown()
    for variable, value in defaults.items():
        os.environ.setdefault(variable, value)


def _env_from_slurm():
    """Under srun, torch's env:// rendezvous would fail as under a plain mpirun. Fills RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT and, where Slurm says them, LOCAL_RANK,
    LOCAL_WORLD_SIZE and NODE_RANK by hora's own Slurm rules (hora._launch.slurm_config: the
    first host of the step's node list, port 10000 + SLURM_JOB_ID % 20000 unless MASTER_PORT is
    set), so that torch's world is the one hora_init() would form. Only where hora would take
    its world from Slurm (not under mpirun in an allocation, not with all of torch's variables
    set); variables already set are kept. No communication: every task computes the same."""
    try:
        os.environ.update(_launch.torch_env_from_slurm(os.environ))
    except ValueError as e:
        raise ValueError("hora.distributed: cannot give torch's env:// variables from Slurm's: %s"
                         % e) from None


def _register():
    """Registers "hora" with torch.distributed. torch 2 also asks which devices a plugin serves
    (without `devices` it warns and assumes cpu and cuda): hora's tensors may be CPU or CUDA
    (through NCCL; an extension built without CUDA refuses CUDA tensors with a message saying
    so). torch 1.13's register_backend has no `devices`. Not tried on torch 2 here (only 1.13 is
    installed; see process_group_hora.h)."""
    if int(torch.__version__.split(".")[0]) >= 2:
        dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True,
                                      devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True)


if BACKEND.upper() not in dist.Backend._plugins:
    _register()
    _torch_c10d._new_process_group_helper = _new_process_group_helper
    _env_from_mpi()
    _env_from_slurm()
