# SPDX-License-Identifier: Apache-2.0
"""hora's exceptions: one class per status of the C API, all under HoraError (a RuntimeError).

The message is hora's own: it names the tensor, the op and the ranks involved. ``status`` is the
C API's ``hora_status_t`` value.
"""

__all__ = [
    "HoraError", "InvalidArgumentError", "NotInitializedError", "DuplicateNameError",
    "MismatchError", "UnsupportedError", "HoraTimeoutError", "PeerLostError", "BackendError",
    "ShutDownError", "InternalError", "error_class",
]


class HoraError(RuntimeError):
    """A hora call failed. ``status`` is the C status code, ``str(e)`` hora's message."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(HoraError, ValueError):
    """Caller error (bad tensor, op, root, name...); nothing was submitted."""
    status = 1


class NotInitializedError(HoraError, ValueError):
    """hora.init() has not run (or the runtime was shut down). Also a ValueError, the class
    Horovod raises for it."""
    status = 2


class DuplicateNameError(HoraError, ValueError):
    """An op of that name is already in flight on this rank. Also a ValueError, as Horovod's
    "tensor with the same name" error is."""
    status = 3


class MismatchError(HoraError):
    """Ranks disagreed on dtype, shape, op, root, scale or device: the op failed on every rank;
    the runtime stays usable."""
    status = 4


class UnsupportedError(HoraError, NotImplementedError):
    """Not supported by this build or for this dtype (a CUDA tensor without NCCL, Average on
    integers)."""
    status = 5


class HoraTimeoutError(HoraError, TimeoutError):
    """HORA_TIMEOUT_S or HORA_STALL_SHUTDOWN_S ran out; the message names the missing ranks.
    Also a TimeoutError."""
    status = 6


class PeerLostError(HoraError):
    """A rank died or left; the runtime is poisoned: shut down."""
    status = 7


class BackendError(HoraError):
    """MPI, Gloo, NCCL or CUDA reported an error; the runtime is poisoned."""
    status = 8


class ShutDownError(HoraError):
    """The runtime shut down before the op finished."""
    status = 9


class InternalError(HoraError):
    """A bug in hora: please report it with the message."""
    status = 10


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, NotInitializedError, DuplicateNameError, MismatchError,
    UnsupportedError, HoraTimeoutError, PeerLostError, BackendError, ShutDownError,
    InternalError)}


def error_class(status):
    """The exception class of a C status code (HoraError for one this version does not know)."""
    return _BY_STATUS.get(int(status), HoraError)
