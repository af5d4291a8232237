# SPDX-License-Identifier: Apache-2.0
"""Process sets: collectives among a subset of the ranks, as in Horovod.

    evens = hora.add_process_set([0, 2])        # collective: every rank calls it
    if evens.included():
        hora.allreduce(x, process_set=evens)
    hora.remove_process_set(evens)
"""

from . import _hora

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ProcessSet:
    """Some ranks of the world, by their world ranks. Usable in collectives once registered
    with add_process_set (or passed to init(process_sets=...))."""

    def __init__(self, ranks):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def _id(self):
        if self.process_set_id is None:
            raise ValueError("hora: process set %s is not registered: call "
                             "hora.add_process_set on every rank first" % (self.ranks,))
        return self.process_set_id

    def size(self):
        """Number of ranks in the set (None before it is registered)."""
        if self.process_set_id is None:
            return None if self.ranks is None else len(self.ranks)
        return _hora.process_set_size(self.process_set_id)

    def rank(self):
        """This process's rank within the set; -1 if it is not a member."""
        return _hora.process_set_rank(self._id())

    def included(self):
        """Whether this process is a member."""
        return self.rank() >= 0

    def __repr__(self):
        if self.ranks is None:
            return "ProcessSet(process_set_id=0, ranks=all)"
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


class _GlobalProcessSet(ProcessSet):
    """Every rank: process set 0."""

    def __init__(self):
        super().__init__(None)
        self.process_set_id = 0


global_process_set = _GlobalProcessSet()


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of world ranks) and returns it. Collective over the
    world: every rank calls it with the same ranks."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise ValueError("hora: the global process set is always registered")
    process_set.process_set_id = _hora.process_set_create(process_set.ranks)
    return process_set


def remove_process_set(process_set):
    """Unregisters a set made by add_process_set. Returns False for the global set."""
    if process_set.process_set_id in (None, 0):
        return False
    _hora.process_set_destroy(process_set.process_set_id)
    process_set.process_set_id = None
    return True


def set_id(process_set):
    """The C id of a ProcessSet or of an int id."""
    if isinstance(process_set, ProcessSet):
        return process_set._id()  # pylint: disable=protected-access
    return int(process_set)
