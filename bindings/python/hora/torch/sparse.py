# SPDX-License-Identifier: Apache-2.0
"""Sparse allreduce, as horovod.torch's sparse_allreduce_async: a sparse COO tensor is reduced by
gathering every rank's indices and values (two allgathers) and concatenating them; the result
is an uncoalesced sparse tensor whose duplicate entries add up to the sum over ranks."""

import torch

import hora
from hora import global_process_set

from .mpi_ops import Adasum, Average, Sum, _to_integer, allgather_async, poll, synchronize

__all__ = ["sparse_allreduce_async"]


class SparseHandle(hora.Handle):
    """The handle of sparse_allreduce_async: synchronize(handle) (or handle(), as Horovod's
    function-handle is called) returns the reduced sparse tensor; poll(handle) never blocks."""

    __slots__ = ()

    def __call__(self):
        return self.wait()


class _Gathers:
    """The two allgathers of one sparse allreduce, as one request for hora.Handle."""

    def __init__(self, indices, values):
        self.handles = (indices, values)
        self.results = None

    def poll(self):
        return all(poll(h) for h in self.handles)

    def wait(self):
        # wait for both before raising, so that no op of this call is left in flight
        results, error = [], None
        for h in self.handles:
            try:
                results.append(synchronize(h))
            except Exception as e:  # pylint: disable=broad-except
                error = error or e
        if error is not None:
            raise error
        self.results = results


def _set_size(process_set):
    if isinstance(process_set, hora.ProcessSet):
        return process_set.size()
    return hora._hora.process_set_size(int(process_set))  # pylint: disable=protected-access


def _reject(name, process_set, reason):
    """Tells the set's other ranks that this rank gives up both allgathers (they fail at once
    instead of waiting for it)."""
    reject = getattr(hora._hora, "reject", None)  # pylint: disable=protected-access
    if reject is None:
        return
    try:
        ps = hora.process_sets.set_id(process_set)
    except (ValueError, TypeError):
        return
    for part in ("indices", "values"):
        reject("allgather", "" if name is None else "%s.%s" % (name, part), ps, reason)


def _averaged(result, size):
    """`result` (the sum over ranks) divided by the set's size. Integer values: truncated toward
    zero and saturated, as hora.torch's dense Average of integers."""
    indices, values = result._indices(), result._values()  # pylint: disable=protected-access
    if values.dtype.is_floating_point or values.dtype.is_complex:
        return torch.sparse_coo_tensor(indices, values / size, result.shape)
    summed = result.coalesce()  # sum the duplicates before rounding
    scaled = _to_integer(summed.values().double() / size, values.dtype)
    return torch.sparse_coo_tensor(summed.indices(), scaled, result.shape)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts reducing the sparse COO `tensor` over the ranks of the set (Sum, or Average,
    which divides the values by the set's size). Returns a handle: synchronize(handle) (or
    handle()) gives a sparse tensor of `tensor`'s shape. Ranks may have different numbers of
    entries; sparse and dense dimensions must agree. The ops are named `name`.indices and
    `name`.values (by call order when `name` is None)."""
    problem = None
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        problem = ("hora.torch.sparse_allreduce_async: expected a sparse COO tensor, got %s"
                   % (tensor.layout if isinstance(tensor, torch.Tensor)
                      else type(tensor).__name__))
        kind = TypeError
    elif op is Adasum or op not in (Sum, Average):
        problem = ("hora.torch.sparse_allreduce_async: op must be Sum or Average (sparse "
                   "tensors are reduced by gathering their entries), got %r" % (op,))
        kind = ValueError
    if problem is not None:
        _reject(name, process_set, problem)
        raise kind(problem)

    # Both go flat (1-D): a rank with no entries then sends an empty 1-D tensor, which every
    # framework exports compactly (torch gives an empty (0, k) tensor odd DLPack strides).
    indices = tensor._indices().t().reshape(-1)  # pylint: disable=protected-access
    values = tensor._values().detach()  # pylint: disable=protected-access
    row = values.shape[1:]
    gathers = _Gathers(
        allgather_async(indices.contiguous(), None if name is None else "%s.indices" % name,
                        process_set),
        allgather_async(values.reshape(-1).contiguous(),
                        None if name is None else "%s.values" % name, process_set))
    shape = tensor.shape
    sparse_dim = tensor.sparse_dim()

    def finish(request):
        all_indices, all_values = request.results
        result = torch.sparse_coo_tensor(all_indices.reshape(-1, sparse_dim).t(),
                                         all_values.reshape((-1,) + tuple(row)), shape)
        if op == Average:
            result = _averaged(result, _set_size(process_set))
        return result

    return SparseHandle(gathers, finish)
