# SPDX-License-Identifier: Apache-2.0
"""hora.run: a function on N local ranks, as horovod.run (`horovod.run(fn, np=2)`) does.

    import hora
    def work(scale):
        hora.init()
        return hora.allreduce(np.ones(2) * hora.rank(), op=hora.Sum) * scale
    results = hora.run(work, args=(10,), np=2)      # [array([10., 10.]), array([10., 10.])]

Each rank is a child process forked from the caller, so `fn` may be a lambda or a closure (it is
never pickled); its return value comes back pickled. The children form a hora world through the
torchrun-style variables hora's env:// bootstrap reads (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, plus HORA_BOOTSTRAP=env and a fresh HORA_JOB_TOKEN),
as horarun's local mode sets them, and OMP_NUM_THREADS=1 unless `env` names another (as
torchrun does; more threads in a rank can hang when the caller already used torch's thread pool,
which fork does not copy).
"""

import ctypes
import mmap
import os
import pickle
import secrets
import selectors
import signal
import sys
import threading
import time
import traceback

from . import _ports

__all__ = ["run", "RunError", "RunTimeoutError"]

# Variables that would make a rank believe an outer launcher (mpirun, srun) started it: removed,
# as horarun removes them (an outer world's size would contradict WORLD_SIZE).
_LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "PRTE_", "HYDRA_", "MPI_LOCAL", "SLURM_STEP_")
_SLURM_TASK_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID",
                    "SLURM_NODEID", "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_STEPID",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_GRACE_S = 2.0  # SIGTERM, then SIGKILL this long after
_EXIT_WAIT_S = 30.0  # after every result: how long the ranks get to shut hora down and exit


class RunError(RuntimeError):
    """A rank of hora.run failed. ``rank``: which; ``traceback``: its traceback as text (None
    if it died without one); ``exitcode``: its exit status (negative: killed by that signal;
    None if unknown); ``exception``: the exception it raised, when it could be pickled."""

    def __init__(self, message, rank=None, traceback_text=None, exitcode=None, exception=None):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback_text
        self.exitcode = exitcode
        self.exception = exception


class RunTimeoutError(RunError, TimeoutError):
    """hora.run's `timeout` ran out; the ranks still running were stopped."""


def _free_port():
    """A port for the ranks' store, reserved against other jobs' picks (hora/_ports.py)."""
    return _ports.free_port("127.0.0.1")


def _rank_environment(rank, size, port, token, extra):
    for name in list(os.environ):
        if name.startswith(_LAUNCHER_PREFIXES) or name in _SLURM_TASK_VARS:
            del os.environ[name]
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size),
        "NODE_RANK": "0", "GROUP_RANK": "0", "HORA_BOOTSTRAP": "env", "HORA_JOB_TOKEN": token,
    })
    os.environ.update(extra)  # after ours: the caller's explicit choice


def _die_with_parent(parent):
    """Linux: this child gets SIGKILL when the process that forked it dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # died before prctl
        os._exit(1)


def _one_thread(extra):
    """One OpenMP thread per rank unless `env` says otherwise, as torchrun does. Forked from a
    process whose OpenMP pool already ran (torch did some work), a rank that used several
    threads would wait forever for the pool's threads, which fork does not copy."""
    threads = extra.get("OMP_NUM_THREADS", "1")
    os.environ["OMP_NUM_THREADS"] = threads
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _report_waits(board, rank):
    """A rank's daemon thread: board[rank] is 1 while a thread of the rank is inside a blocking
    hora call (waiting for the other ranks), else 0; the parent reads the board when the timeout
    runs out, to name the rank that hung rather than those waiting for it."""
    while True:
        hora_module = sys.modules.get("hora._hora")
        waiting = hora_module is not None and hora_module._blocked_calls() > 0
        board[rank] = 1 if waiting else 0
        time.sleep(0.1)


def _child(fn, args, kwargs, rank, size, port, token, extra, write_fd, parent, board):
    """The rank's whole life; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: stopping it stops what it started
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _rank_environment(rank, size, port, token, extra)
        _one_thread(extra)
        threading.Thread(target=_report_waits, args=(board, rank), daemon=True,
                         name="hora.run waits").start()
        try:
            payload = pickle.dumps(("ok", fn(*args, **kwargs)), protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        except BaseException as e:  # pylint: disable=broad-except
            # from fn's frame on (this function's own frame says nothing to the caller)
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
            try:
                exc = pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(exc)
            except Exception:  # pylint: disable=broad-except
                exc = None
            payload = pickle.dumps(("error", text, exc), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
        hora = sys.modules.get("hora")
        if code == 0 and hora is not None and hora.is_initialized():
            hora.shutdown()  # collective: every rank that succeeded gets here
    except BaseException:  # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # neither the caller's atexit handlers nor its buffered output


def _describe(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        return "was killed by %s" % name, -sig
    code = os.WEXITSTATUS(status)
    return "exited with status %d" % code, code


def _signal(pid, sig):
    """`sig` to the rank's process group (what it started too), else to the rank itself."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stop(live):
    """SIGTERM to every rank still running, SIGKILL to those left after the grace period;
    reaps them all and empties `live` (rank -> pid)."""
    for pid in live.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while live and time.monotonic() < deadline:
        for rank, pid in list(live.items()):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                del live[rank]
        time.sleep(0.01)
    for pid in live.values():
        _signal(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    live.clear()


def run(func, args=(), kwargs=None, num_proc=None, np=None, env=None, timeout=None,  # noqa: C901
        hosts=None, hostfile=None, use_mpi=None, use_gloo=None, verbose=None):
    """Runs func(*args, **kwargs) on `np` (or Horovod's `num_proc`) ranks on this machine and
    returns their results in rank order. `func` usually calls hora.init() (or hora.torch's);
    the ranks form one world. `env`: variables to add to every rank's environment. `timeout`
    (seconds, None: none): after it the ranks still running are stopped and RunTimeoutError is
    raised. If a rank raises or dies, the others are stopped and RunError is raised naming that
    rank, with its traceback. Must be called where hora is not running (the children start it).
    Horovod's `use_gloo` and `verbose` are accepted and ignored; `hosts`, `hostfile` and
    `use_mpi=True` are refused (use tools/horarun for those)."""
    del use_gloo, verbose
    if hosts is not None or hostfile is not None or use_mpi:
        raise ValueError("hora.run starts ranks on this machine only; for several hosts or "
                         "MPI use horarun (-H, --hostfile)")
    if np is not None and num_proc is not None and np != num_proc:
        raise ValueError("hora.run: np=%r and num_proc=%r disagree" % (np, num_proc))
    size = np if np is not None else (num_proc if num_proc is not None else 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError("hora.run: np must be a positive integer, got %r" % (size,))
    if timeout is not None and timeout <= 0:
        raise ValueError("hora.run: timeout must be positive (seconds) or None")
    if not callable(func):
        raise TypeError("hora.run: func must be callable, got a %s" % type(func).__name__)
    hora = sys.modules.get("hora")
    if hora is not None and hora.is_initialized():
        raise RuntimeError("hora.run: hora is running in this process; its ranks are forked "
                           "from it and start their own: call hora.run before hora.init()")
    kwargs = dict(kwargs or {})
    extra = {str(k): str(v) for k, v in (env or {}).items()}
    token = extra.get("HORA_JOB_TOKEN") or os.environ.get("HORA_JOB_TOKEN") or secrets.token_hex(32)
    port = int(extra.get("MASTER_PORT", _free_port()))

    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    live = {}  # rank -> pid of a child not reaped yet
    readers = {}  # read end of a rank's result pipe -> rank
    selector = selectors.DefaultSelector()
    board = mmap.mmap(-1, size)  # shared with the ranks: 1 while rank r waits in hora
    try:
        for rank in range(size):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                for fd in readers:
                    os.close(fd)
                _child(func, args, kwargs, rank, size, port, token, extra, write_fd, parent, board)
            os.close(write_fd)
            try:
                os.setpgid(pid, pid)  # as the child does: no window where it has none
            except OSError:
                pass  # it already did, or already exited
            live[rank] = pid
            readers[read_fd] = rank
            os.set_blocking(read_fd, False)
            selector.register(read_fd, selectors.EVENT_READ)
        return _collect(size, live, readers, selector, timeout, board)
    finally:
        # success, a failed rank, a timeout or our own interruption (Ctrl-C): none is left
        _stop(live)
        for fd in list(readers):
            selector.unregister(fd)
            os.close(fd)
        selector.close()


def _collect(size, live, readers, selector, timeout, board):
    """Reads every rank's result; raises for the first rank that fails."""
    deadline = None if timeout is None else time.monotonic() + timeout
    data = {rank: bytearray() for rank in range(size)}
    results = {}
    statuses = {}  # rank -> (wait status, when it was reaped)
    while len(results) < size:
        wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
        for key, _ in selector.select(wait):
            rank = readers[key.fd]
            chunk = os.read(key.fd, 1 << 16)
            if chunk:
                data[rank] += chunk
                continue
            selector.unregister(key.fd)
            os.close(key.fd)
            del readers[key.fd]
            outcome = _decode(rank, bytes(data[rank]))
            if outcome[0] != "ok":
                _fail(rank, size, outcome, live, statuses)
            results[rank] = outcome[1]
        now = time.monotonic()
        for rank, pid in list(live.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                statuses[rank] = (status, now)
                del live[rank]
        for rank, (status, when) in statuses.items():
            # exited, and its pipe is still open after a while: a process it started holds it
            if rank not in results and now - when > _GRACE_S:
                _fail(rank, size, ("lost", None, None), live, statuses)
        if deadline is not None and now >= deadline and len(results) < size:
            missing = [r for r in range(size) if r not in results]
            # Ranks waiting inside hora wait for the others; those that are not are where the
            # job hung (in their own code, or stopped).
            waiting = [r for r in missing if board[r] == 1]
            hung = [r for r in missing if board[r] != 1]
            _stop(live)
            if waiting and hung:
                raise RunTimeoutError(
                    "hora.run: the timeout (%s s) ran out: rank%s %s never returned and %s not "
                    "in a hora call (hung in its own code, or stopped); rank%s %s waited in hora "
                    "for %s; every rank was stopped"
                    % (timeout, _s(hung), _ranks(hung), "was" if len(hung) == 1 else "were",
                       _s(waiting), _ranks(waiting), "it" if len(hung) == 1 else "them"),
                    rank=hung[0])
            raise RunTimeoutError("hora.run: the timeout (%s s) ran out before rank%s %s "
                                  "returned; every rank was stopped"
                                  % (timeout, _s(missing), _ranks(missing)), rank=missing[0])
    # every result is in: the ranks shut hora down and exit
    end = time.monotonic() + _EXIT_WAIT_S
    while live and time.monotonic() < end:
        for rank, pid in list(live.items()):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                del live[rank]
        time.sleep(0.01)
    return [results[rank] for rank in range(size)]


def _s(ranks):
    return "s" if len(ranks) > 1 else ""


def _ranks(ranks):
    return ", ".join(map(str, ranks))


def _decode(rank, payload):
    if not payload:
        return ("lost", None, None)
    try:
        return pickle.loads(payload)
    except Exception as e:  # pylint: disable=broad-except
        return ("error", "rank %d's result could not be unpickled: %r\n" % (rank, e), None)


def _fail(rank, size, outcome, live, statuses):
    """Stops every rank and raises the RunError of `rank`."""
    if outcome[0] == "lost":
        # it closed its pipe without a result: wait a moment for its exit status
        end = time.monotonic() + _GRACE_S
        while rank in live and time.monotonic() < end:
            got, status = os.waitpid(live[rank], os.WNOHANG)
            if got:
                statuses[rank] = (status, time.monotonic())
                del live[rank]
            else:
                time.sleep(0.01)
    _stop(live)
    if outcome[0] == "lost":
        status = statuses.get(rank, (None, 0))[0]
        how, code = ("exited", None) if status is None else _describe(status)
        raise RunError("hora.run: rank %d of %d %s without returning a result" % (rank, size, how),
                       rank=rank, exitcode=code)
    _, text, exc = outcome
    exception = None
    if exc is not None:
        try:
            exception = pickle.loads(exc)
        except Exception:  # pylint: disable=broad-except
            exception = None
    lines = text.strip().splitlines()
    raise RunError("hora.run: rank %d of %d raised %s\n%s"
                   % (rank, size, lines[-1] if lines else "an error", text),
                   rank=rank, traceback_text=text, exitcode=1, exception=exception)
