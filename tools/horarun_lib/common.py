# SPDX-License-Identifier: Apache-2.0
"""What every part of horarun shares: the variables a rank must not inherit, the job token, the
hora tools beside horarun, horarun's own output streams, and its two kinds of error."""

import ctypes
import os
import re
import secrets
import select
import shutil
import signal
import socket
import sys

from .ports import free_port  # noqa: F401  (re-exported: local.py and restart.py pick ports)

# Variables that make hora_init() (and MPI or Slurm aware libraries) believe they were started by
# an MPI launcher or by srun. An outer `mpirun -np 1 horarun ...` or `srun horarun ...` leaves them
# in our environment; passed on, they would override HORA_BOOTSTRAP=env in every library that reads
# them and describe a world of the wrong size. Job-level Slurm variables (SLURM_JOB_ID, the job's
# node list) describe the allocation, not the task, and stay.
# (PRTE_: Open MPI 5; HYDRA_ and MPI_LOCALRANKID/MPI_LOCALNRANKS: MPICH's mpiexec.)
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "PRTE_", "HYDRA_", "MPI_LOCAL")
SLURM_TASK_VARS = {
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_STEPID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
}
SLURM_TASK_PREFIXES = ("SLURM_STEP_",)

# The job's shared secret (docs/security.md): set for every rank unless the user chose one.
TOKEN_VAR = "HORA_JOB_TOKEN"

# What a local rank is told about the world (as torchrun does), plus how to form it.
RANK_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "NODE_RANK", "GROUP_RANK", "HORA_BOOTSTRAP")

HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")

# The folder of the horarun script that runs (its real path, a symlink resolved): the hora tools
# installed beside it and the build folders of the source tree it is in are looked for from
# there. The script sets it; without the script, the package's own parent (tools/ of the tree).
SCRIPT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def tool_candidates(name, variable):
    """Where a hora tool may be, best first: $variable alone if set; else next to horarun
    (installed), the build directories of the source tree horarun is in (newest first), PATH."""
    named = os.environ.get(variable)
    if named:
        return [named]
    here = SCRIPT_DIR
    found = [os.path.join(here, name)]
    root = os.path.dirname(here)
    if os.path.isfile(os.path.join(root, "meson.build")):
        try:
            builds = [os.path.join(root, d, "tools", name) for d in os.listdir(root)]
        except OSError:
            builds = []
        builds = [b for b in builds if os.path.isfile(b)]
        found += sorted(builds, key=lambda b: -os.path.getmtime(b))
    on_path = shutil.which(name)
    if on_path:
        found.append(on_path)
    return found


def find_tool(name, variable):
    """The first executable of tool_candidates, or None."""
    for f in tool_candidates(name, variable):
        if os.path.isfile(f) and os.access(f, os.X_OK):
            return f
    return None


class UsageError(Exception):
    """A problem with the command line: reported as usage (exit status 2)."""


class AgentError(Exception):
    """The job cannot go on: the message says why, status is horarun's exit status."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "SIG%d" % signum


def describe_exit(returncode):
    """Popen returncode -> ('exited with status 3' | 'was killed by signal 9 (SIGKILL)', code)."""
    if returncode < 0:
        sig = -returncode
        return "was killed by signal %d (%s)" % (sig, signal_name(sig)), 128 + sig
    return "exited with status %d" % returncode, returncode


def plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def is_launcher_var(name):
    return (name.startswith(LAUNCHER_PREFIXES) or name in SLURM_TASK_VARS or
            name.startswith(SLURM_TASK_PREFIXES))


class Sink:
    """One of horarun's own output streams. Every write is whole, so lines never interleave."""

    def __init__(self, stream):
        self.stream = stream
        self.broken = False

    def write(self, data):
        if self.broken or not data:
            return
        try:
            self.stream.flush()  # anything Python buffered goes first
            fd = self.stream.fileno()
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:  # an inherited non-blocking descriptor
                    select.select([], [fd], [], 1.0)
        except (BrokenPipeError, ValueError, OSError):
            # "horarun ... | head": the reader is gone. The ranks keep running; their output is
            # dropped rather than killing the job for it.
            self.broken = True


STDOUT = Sink(sys.stdout)
STDERR = Sink(sys.stderr)


def say(message):
    STDERR.write(("horarun: %s\n" % message).encode("utf-8", "replace"))


def job_token(args, base, knobs):
    """HORA_JOB_TOKEN for every rank of this job: the user's (environment or -x), else a fresh
    random one when this horarun starts every rank; None when it cannot (--nnodes above 1: the
    other machines' horaruns could not know it)."""
    token = knobs.get(TOKEN_VAR) or base.get(TOKEN_VAR)
    if token:
        return token
    if args.nnodes > 1:
        return None
    return secrets.token_hex(32)


def make_child_setup(parent_pid):
    """What each rank runs between fork and exec."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup():
        # The rank has its own session, so a terminal's Ctrl-C reaches only horarun, which then
        # forwards it once. A background job inherits SIGINT ignored from its shell; reset it so a
        # forwarded SIGINT/SIGTERM works.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        if prctl is not None:
            # If horarun itself is SIGKILLed, take the rank with it (PR_SET_PDEATHSIG = 1).
            prctl(1, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # horarun died before the line above
                os.kill(os.getpid(), signal.SIGKILL)

    return setup
