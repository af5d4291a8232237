# SPDX-License-Identifier: Apache-2.0
"""A free TCP port for a job's rank 0 to bind moments later, safe from other jobs on the machine.

horarun picks MASTER_PORT with it; the hora Python package (hora.run, hora.distributed) ships a
copy of this file as hora/_ports.py (bindings/python/hora/meson.build). Only the standard library.
"""

import fcntl
import os
import random
import socket

# Ports handed out: below the kernel's ephemeral range, where no bind(port 0) and no
# outgoing connection lands, so between the pick and rank 0's bind only another pick could take
# the port; and every pick holds a lock on its port's byte of one file for the life of the process
# that picked, so two jobs starting on one machine at once never pick the same port.
PORT_LOCKS = ("/run/lock/hora-ports", "/var/lock/hora-ports")
PORT_LOW = 20000
_port_locks = {"fd": None, "opened": False, "held": set()}  # this process's: kept until it exits


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _lock_fd():
    """The lock file, opened once per process and never closed: closing any descriptor of it
    would drop every lock this process holds on it (POSIX record locks)."""
    if not _port_locks["opened"]:
        _port_locks["opened"] = True
        for path in PORT_LOCKS:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError:
                continue  # no such directory, or another user's file we may not write
            try:
                os.fchmod(fd, 0o666)  # other users' jobs lock in the same file
            except OSError:
                pass
            _port_locks["fd"] = fd
            break
    return _port_locks["fd"]


def _bindable(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(addr):
    """A TCP port nobody listens on now, for rank 0 (or torch's store) to bind moments later:
    picked at random from PORT_LOW up to the ephemeral range (torch's default 29500-29509 left
    alone) and reserved for this process's life (PORT_LOCKS). Where that range is empty or taken,
    the kernel picks (bind to port 0)."""
    # ADDR may be another machine's (--nnodes) or not an IPv4 literal.
    host = next((h for h in (addr, "127.0.0.1") if _bindable(h, 0)), None)
    if host is None:
        raise OSError("cannot bind any TCP port on 127.0.0.1")
    candidates = [p for p in range(PORT_LOW, _ephemeral_low())
                  if not 29500 <= p < 29510 and p not in _port_locks["held"]]
    fd = _lock_fd() if candidates else None
    for port in random.SystemRandom().sample(candidates, min(len(candidates), 200)):
        if fd is not None:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
            except OSError:
                continue  # another job's pick
        if _bindable(host, port):
            _port_locks["held"].add(port)
            return port
        if fd is not None:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, port, os.SEEK_SET)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
