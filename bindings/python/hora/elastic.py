# SPDX-License-Identifier: Apache-2.0
"""Elastic training, Horovod's model: when a worker is lost, the survivors roll back to their
last commit, form a smaller world and carry on; workers that join (horarun's
--host-discovery-script) come in at the next commit. Start the job with horarun's elastic
options (--min-np, --max-np, --host-discovery-script); docs/elastic.md has the details.

    state = hora.elastic.ObjectState(epoch=0, batch=0)

    @hora.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

hora.torch.elastic.TorchState keeps a model and an optimizer as well.
"""

import copy
import functools
import os
import pickle

from . import _hora
from .errors import BackendError, HoraTimeoutError, PeerLostError, ShutDownError

__all__ = ["run", "State", "ObjectState", "HostsUpdatedInterrupt", "world_changed",
           "is_elastic"]

# What a lost worker does to the others' ops: the world is broken, a new one can be formed.
_RESETTABLE = (PeerLostError, HoraTimeoutError, BackendError, ShutDownError)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() (and check_host_updates()) on every rank at once when the
    agents are forming a new world: a worker waits to join, or one was lost. run() catches it,
    re-forms the world and calls the function again; the state was just committed, so nothing
    is rolled back."""

    def __init__(self, skip_sync=False):
        super().__init__("horarun's agents are forming a new world")
        self.skip_sync = skip_sync


def is_elastic():
    """Whether this process is an elastic worker that horarun started."""
    return os.environ.get("HORA_ELASTIC") == "1"


def world_changed():
    """True when the agents are forming a new world (this rank's view; not collective)."""
    return _hora.elastic_world_changed()


def _broadcast_object(obj, root_rank=0):
    """`obj` from root_rank to every rank, pickled, through two broadcasts."""
    import numpy as _np

    from .ops import broadcast_
    if _hora.rank() == root_rank:
        payload = _np.frombuffer(pickle.dumps(obj), dtype=_np.uint8).copy()
        length = _np.array([payload.size], dtype=_np.int64)
    else:
        length = _np.zeros(1, dtype=_np.int64)
    broadcast_(length, root_rank, name="elastic.object.length")
    if _hora.rank() != root_rank:
        payload = _np.empty(int(length[0]), dtype=_np.uint8)
    broadcast_(payload, root_rank, name="elastic.object.payload")
    return pickle.loads(payload.tobytes()) if _hora.rank() != root_rank else obj


class State:
    """What a training loop must keep across a change of world. Subclasses say how to save(),
    restore() and sync() it. commit() saves and then checks for a new world."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or _broadcast_object
        self._rank = get_rank or _hora.rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (in order) after every re-formed world, once the state is synced:
        the place to rescale a learning rate by hora.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (what a lost worker rolls back to), then raises HostsUpdatedInterrupt
        if a new world is forming. Collective: every rank commits at the same point."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when rank 0 sees a new world forming."""
        changed = bool(self._rank() == 0 and is_elastic() and world_changed())
        if self._bcast_object(changed, 0):
            raise HostsUpdatedInterrupt()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """Picklable attributes, given as keyword arguments: ObjectState(epoch=0, batch=0) has
    state.epoch and state.batch. sync() gives every rank rank 0's values."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = {}
        ObjectState.save(self)

    def save(self):
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self):
        if self._names:
            self._saved = self._bcast_object(self._saved, 0)
            ObjectState.restore(self)


def _reset():
    """Leaves the broken or outdated world and joins the agents' next one."""
    from . import init, shutdown
    from .errors import HoraError
    try:
        shutdown()
    except HoraError:
        pass  # the world was already broken: hora_init reaps it
    init()


def run(func):
    """Decorator of the training function `func(state, ...)`. On a lost worker (PeerLostError,
    HoraTimeoutError, BackendError, ShutDownError) it restores the last commit; on
    HostsUpdatedInterrupt it keeps the state as committed; then it joins the agents' next world,
    syncs the state from the new rank 0, runs the reset callbacks and calls func again.
    Outside an elastic job (not started by horarun's elastic options) errors propagate."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        reset = False
        skip_sync = False
        while True:
            try:
                if reset:
                    _reset()
                if not skip_sync:
                    state.sync()
                if reset:
                    state.on_reset()
                return func(state, *args, **kwargs)
            except _RESETTABLE:
                if not is_elastic():
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            reset = True

    return wrapper
