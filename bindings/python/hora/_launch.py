# SPDX-License-Identifier: Apache-2.0
"""Launch rules shared by hora's Python faces: where hora's env:// store listens when
torch.distributed may share the process, and torch's env:// variables under Slurm.

The C bootstrap (lib/bootstrap/bootstrap.cpp, lib/bootstrap/env/launch_config.cpp) decides how
hora_init() forms the world; what it reads is mirrored here, rule for rule, so that what the
Python side gives torch and what hora_init() then does agree, every rank working it out alone.

hora's store and torch's (docs/torch-errors.md, "One rendezvous for both faces"): under env://
(torchrun's variables) or Slurm, torch's rank 0 serves its TCPStore on MASTER_PORT, where
hora_init() would serve its own. So hora, started from Python, serves its store on a port that
rank 0 picks free on its host and passes to the others through torch's store:
  - torch's default group exists already: through that group's store;
  - torch is loaded (hora.torch loads it) but has no group yet: through torch's env:// store,
    opened here as init_process_group would open it (MASTER_PORT, or Slurm's port), and closed
    on every rank once hora's world has formed, before any rank goes on (a hora barrier);
    torch's group, made later, opens it afresh;
  - torch is not loaded: hora_init() serves on MASTER_PORT, as from C.
Under mpirun hora forms its world through MPI, and under horarun through its agents' store
(HORA_AGENT_STORE): neither touches MASTER_PORT, and nothing changes there.
"""

import os
import re
import socket
import sys

from . import _ports

# Mirrors kMaxHosts in launch_config.cpp: an expansion bigger than any real allocation is a
# malformed list, not a job.
_MAX_HOSTS = 1 << 20
_INT_MAX = 2 ** 31 - 1
_INT64 = 2 ** 63
_MPI_LAUNCHER = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
_TORCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def _var(env, name):
    """The value, or None when unset; set-but-empty counts as unset (as in the C lookup)."""
    value = env.get(name)
    return value if value else None


def _parse_int(text):
    """Decimal integer, optional leading '-', nothing else; None if malformed (parseInt)."""
    if not re.fullmatch(r"-?[0-9]+", text or ""):
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def _int_var(name, value, minimum):
    v = _parse_int(value)
    if v is None:
        raise ValueError("%s='%s' is not an integer" % (name, value))
    if v < minimum:
        raise ValueError("%s=%s is %s" % (name, value,
                                          "negative" if minimum == 0 else "not a positive integer"))
    if v > _INT_MAX:
        raise ValueError("%s=%s is too large" % (name, value))
    return v


def _optional_int(env, name, minimum):
    value = _var(env, name)
    return -1 if value is None else _int_var(name, value, minimum)


def _port_var(name, value):
    v = _parse_int(value)
    if v is None:
        raise ValueError("%s='%s' is not an integer" % (name, value))
    if v < 1 or v > 65535:
        raise ValueError("%s=%s is outside 1..65535" % (name, value))
    return v


def _check_below(name, value, limit_name, limit):
    if value >= 0 and limit >= 0 and value >= limit:
        raise ValueError("%s=%d is not below %s=%d" % (name, value, limit_name, limit))


def _check_not_above(name, value, limit_name, limit):
    if value >= 0 and limit >= 0 and value > limit:
        raise ValueError("%s=%d is above %s=%d" % (name, value, limit_name, limit))


def _expand_element(item, out):
    """Appends the expansion of one element ("rack[1-2]-n[01-02]") to out; raises ValueError
    with the reason on malformed input (expandElement)."""
    opening = item.find("[")
    if opening < 0:
        if "]" in item:
            raise ValueError("']' without '['")
        out.append(item)
        return
    closing = item.find("]", opening)
    if closing < 0:
        raise ValueError("'[' without ']'")
    prefix, ranges = item[:opening], item[opening + 1:closing]
    if "]" in prefix or "[" in ranges:
        raise ValueError("unbalanced brackets")
    suffixes = []
    _expand_element(item[closing + 1:], suffixes)
    for part in ranges.split(","):
        lo, dash, hi = part.partition("-")
        if not dash:
            hi = lo
        first, last = _parse_int(lo), _parse_int(hi)
        if not lo or not hi or lo[0] == "-" or hi[0] == "-" or first is None or last is None:
            raise ValueError("'%s' in brackets is not a number or a range like 01-04" % part)
        if last < first:
            raise ValueError("range '%s' runs backwards" % part)
        if (last - first) + len(out) >= _MAX_HOSTS:
            raise ValueError("it expands to more than %d hosts" % _MAX_HOSTS)
        # Slurm pads every number of a range to the width of its lower bound: node[08-10].
        for n in range(first, last + 1):
            digits = str(n).rjust(len(lo), "0")
            out.extend(prefix + digits + suffix for suffix in suffixes)
        if len(out) >= _MAX_HOSTS:
            raise ValueError("it expands to more than %d hosts" % _MAX_HOSTS)


def _expand(text):
    if not text:
        raise ValueError("the list is empty")
    hosts, start, depth = [], 0, 0
    for i, c in enumerate(text + ","):  # split at commas outside brackets
        depth += (c == "[") - (c == "]")
        if depth < 0 or depth > 1:
            raise ValueError("unbalanced brackets")
        if c == "," and depth == 0:
            item = text[start:i]
            if not item:
                raise ValueError("an empty host name")
            _expand_element(item, hosts)
            start = i + 1
    if depth != 0:
        raise ValueError("'[' without ']'")
    return hosts


def expand_slurm_nodelist(text):
    """Slurm's compressed host list: "node[01-03,7],gpu-a" -> node01 node02 node03 node7 gpu-a,
    zero padding kept, several bracket groups multiplied out (expandSlurmNodelist)."""
    try:
        return _expand(text)
    except ValueError as e:
        raise ValueError("Slurm node list '%s' is malformed: %s" % (text, e)) from None


def slurm_port_for_job(job_id):
    """The store port under Slurm without MASTER_PORT: 10000 + SLURM_JOB_ID % 20000, below Linux's
    ephemeral ports (slurmPortForJob)."""
    return 10000 + int(job_id) % 20000


def _tasks_per_node(text):
    """SLURM_TASKS_PER_NODE "2(x3),1" -> [2, 2, 2, 1]; None if malformed (parseTasksPerNode)."""
    counts = []
    for item in text.split(","):
        head, paren, tail = item.partition("(")
        count, repeat = _parse_int(head), 1
        if count is None or count < 1 or count > _INT_MAX:
            return None
        if paren:
            if len(tail) < 3 or not tail.startswith("x") or not tail.endswith(")"):
                return None
            repeat = _parse_int(tail[1:-1])
            if repeat is None or repeat < 1 or repeat > _MAX_HOSTS:
                return None
        counts.extend([count] * repeat)
        if len(counts) > _MAX_HOSTS:
            return None
    return counts


def slurm_config(env):
    """What hora_init() reads from a task that srun started (readSlurmConfig), as torch's env://
    variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and LOCAL_RANK, LOCAL_WORLD_SIZE and
    NODE_RANK where Slurm says them. Raises ValueError naming the variable at fault."""
    proc_id = _var(env, "SLURM_PROCID")
    if proc_id is None:
        raise ValueError("SLURM_PROCID is not set; the Slurm bootstrap needs tasks started by srun")
    size_name = "SLURM_NTASKS" if _var(env, "SLURM_NTASKS") else "SLURM_NPROCS"
    ntasks = _var(env, size_name)
    if ntasks is None:
        raise ValueError("SLURM_NTASKS is not set; the Slurm bootstrap needs tasks started by srun")
    size = _int_var(size_name, ntasks, 1)
    rank = _int_var("SLURM_PROCID", proc_id, 0)
    _check_below("SLURM_PROCID", rank, size_name, size)
    local_rank = _optional_int(env, "SLURM_LOCALID", 0)
    node_rank = _optional_int(env, "SLURM_NODEID", 0)

    # Tasks on this node: the step's layout, then the job's, then --ntasks-per-node.
    local_size, local_size_name = -1, "SLURM_NTASKS_PER_NODE"
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = _var(env, name)
        if value is None:
            continue
        counts = _tasks_per_node(value)
        if counts is None:
            raise ValueError("%s='%s' is not a Slurm task count list like '4(x2),3'"
                             % (name, value))
        local_size_name = name
        if 0 <= node_rank < len(counts):
            local_size = counts[node_rank]
        elif all(n == counts[0] for n in counts):
            local_size = counts[0]
        break
    if local_size < 0 and _var(env, "SLURM_NTASKS_PER_NODE"):
        local_size = _int_var("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS_PER_NODE"], 1)
        local_size_name = "SLURM_NTASKS_PER_NODE"
    _check_below("SLURM_LOCALID", local_rank, local_size_name, local_size)
    _check_not_above(local_size_name, local_size, size_name, size)
    _check_below("SLURM_LOCALID", local_rank, size_name, size)
    _check_below("SLURM_NODEID", node_rank, size_name, size)

    # Rank 0 runs on the first node of the step under srun's default (block) distribution.
    master = _var(env, "MASTER_ADDR")
    if master is None:
        list_name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                          if _var(env, n)), None)
        if list_name is None:
            raise ValueError("none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set; "
                             "cannot tell which host runs rank 0")
        try:
            master = _expand(env[list_name])[0]
        except ValueError as e:
            raise ValueError("%s='%s' is not a Slurm node list like 'node[01-04],gpu7': %s"
                             % (list_name, env[list_name], e)) from None

    if _var(env, "MASTER_PORT"):
        port = _port_var("MASTER_PORT", env["MASTER_PORT"])
    elif _var(env, "SLURM_JOB_ID"):
        job = _parse_int(env["SLURM_JOB_ID"])
        if job is None or job < 0:
            raise ValueError("SLURM_JOB_ID='%s' is not a non-negative integer (it sets the store "
                             "port; or set MASTER_PORT)" % env["SLURM_JOB_ID"])
        port = slurm_port_for_job(job)
    else:
        raise ValueError("neither MASTER_PORT nor SLURM_JOB_ID is set; cannot choose the store "
                         "port")

    found = {"RANK": rank, "WORLD_SIZE": size, "MASTER_ADDR": master, "MASTER_PORT": port,
             "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_size, "NODE_RANK": node_rank}
    return {name: str(value) for name, value in found.items() if value != -1}


def bootstrap_kind(env):
    """How hora_init() would form the world from `env` (createBootstrap's order): "mpi", "env",
    "agent" (env:// through horarun's agents' store), "elastic", "slurm", "single", or None when
    HORA_BOOTSTRAP holds a value hora_init() refuses."""
    mode = env.get("HORA_BOOTSTRAP") or "auto"
    if mode not in ("auto", "mpi", "env", "single"):
        return None
    if mode in ("mpi", "single"):
        return mode
    if _var(env, "HORA_ELASTIC") == "1":
        return "elastic"
    rendezvous = all(_var(env, n) for n in _TORCH_ENV)
    slurm = bool(_var(env, "SLURM_PROCID") and _var(env, "SLURM_NTASKS"))
    if mode == "auto" and any(_var(env, n) for n in _MPI_LAUNCHER):
        return "mpi"
    if not rendezvous and slurm:
        return "slurm"
    if rendezvous or mode == "env":
        return "agent" if _var(env, "HORA_AGENT_STORE") else "env"
    return "single"


def torch_env_from_slurm(env):
    """torch's env:// variables for a task srun started, where hora_init() would take its world
    from Slurm: what slurm_config(env) says, for the variables `env` lacks ({} otherwise). Once
    they are set, hora_init() forms the same world through them (all four of MASTER_ADDR,
    MASTER_PORT, RANK and WORLD_SIZE set take it to the env:// path)."""
    if bootstrap_kind(env) != "slurm":
        return {}
    found = slurm_config(env)
    if _var(env, "GROUP_RANK"):  # torchrun's name for NODE_RANK: never both
        found.pop("NODE_RANK", None)
    return {name: value for name, value in found.items() if not _var(env, name)}


def _free_port():
    """A port for rank 0's hora store, reserved against other jobs' picks (hora/_ports.py)."""
    return _ports.free_port("")


_rendezvous_count = 0  # rendezvous agreed through torch's store, the same count on every rank


def agree_through_store(store, rank, size, env):
    """hora's store address agreed through torch's `store` (collective over torch's world): rank
    0 publishes its host and a port free there under a fresh key, every rank reads them. Returns
    the variables hora_init() must see: MASTER_PORT always, and MASTER_ADDR, RANK and WORLD_SIZE
    where `env` lacks them (torch's group may have been made by tcp:// or file://)."""
    global _rendezvous_count
    key = "hora.distributed/rendezvous/%d" % _rendezvous_count
    _rendezvous_count += 1
    if rank == 0:
        store.set(key, "%s %d" % (_var(env, "MASTER_ADDR") or socket.getfqdn(), _free_port()))
    host, port = store.get(key).decode().split()
    wanted = {"MASTER_PORT": port}
    for name, value in (("MASTER_ADDR", host), ("RANK", str(rank)), ("WORLD_SIZE", str(size))):
        if not _var(env, name):
            wanted[name] = value
    return wanted


def _torch_default_world():
    """(store, rank, size) of torch.distributed's default group where one exists, else None.
    Looks only at a torch.distributed that is imported already."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
        from torch.distributed import distributed_c10d  # pylint: disable=import-outside-toplevel
        return distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _torch_env_store(env, kind):
    """torch's env:// store, opened as init_process_group("...", init_method="env://") opens it
    (torch.distributed.rendezvous: rank 0 serves it on MASTER_PORT, multi-tenant; under
    torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE=True, every rank is a client), with
    (rank, size); None where torch.distributed is not loaded or the variables are refused."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist  # pylint: disable=import-outside-toplevel
        if not dist.is_available():
            return None
        if kind == "env":
            addr, port = env["MASTER_ADDR"], _port_var("MASTER_PORT", env["MASTER_PORT"])
            rank = _int_var("RANK", env["RANK"], 0)
            size = _int_var("WORLD_SIZE", env["WORLD_SIZE"], 1)
        else:
            found = slurm_config(env)
            addr, port = found["MASTER_ADDR"], int(found["MASTER_PORT"])
            rank, size = int(found["RANK"]), int(found["WORLD_SIZE"])
        _check_below("RANK", rank, "WORLD_SIZE", size)
    except (ImportError, KeyError, ValueError):
        return None  # hora_init() refuses the launch and says why, in its own words
    import datetime  # pylint: disable=import-outside-toplevel
    try:
        seconds = float(env.get("HORA_TIMEOUT_S") or 300)
    except ValueError:
        seconds = 300.0
    timeout = datetime.timedelta(seconds=seconds if seconds > 0 else 300)
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(addr, port, size, False, timeout)
        store = dist.PrefixStore("/worker/attempt_%s" % env.get("TORCHELASTIC_RESTART_COUNT", "0"),
                                 store)
    else:
        store = dist.TCPStore(addr, port, size, rank == 0, timeout, multi_tenant=True)
    return store, rank, size, "%s:%d" % (addr, port)


class Plan:
    """What hora.init() does around hora_init(): `wanted`, the variables hora_init() must see
    beyond the environment (restored afterwards); `note`, said in a failure naming hora's port;
    `borrowed`, torch's env:// store hora opened to agree its port, which every rank closes once
    hora's world has formed and before any rank goes on (a hora barrier), so that torch's group,
    made later, opens it afresh."""

    def __init__(self, wanted=None, note="", borrowed=None):
        self.wanted = wanted or {}
        self.note = note
        self.borrowed = borrowed


def init_plan(env=None):
    """How hora, started from Python, keeps its store off torch's (this module's docstring)."""
    env = os.environ if env is None else env
    kind = bootstrap_kind(env)
    if kind not in ("env", "slurm", "single") or env.get("HORA_BOOTSTRAP") == "single":
        return Plan()
    world = _torch_default_world()
    if world is not None:
        return Plan(agree_through_store(world[0], world[1], world[2], env),
                    "hora's store port, agreed through torch.distributed's store")
    if kind == "single":
        return Plan()
    opened = _torch_env_store(env, kind)
    if opened is None:
        return Plan()
    store, rank, size, where = opened
    return Plan(agree_through_store(store, rank, size, env),
                "hora's store port, agreed through torch.distributed's env:// store at %s; see "
                "docs/torch-errors.md" % where, borrowed=store)
