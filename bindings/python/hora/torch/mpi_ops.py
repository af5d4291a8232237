# SPDX-License-Identifier: Apache-2.0
"""horovod.torch's collectives on hora, for torch tensors of any dtype (bfloat16 included) on
the CPU, or on CUDA with NCCL. Results keep the input's dtype and device. allreduce, allgather
and broadcast are differentiable, as in Horovod."""

import torch

import hora
from hora import (global_process_set, poll, synchronize, join as _join, barrier as _barrier)

from .compression import Compression

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "join", "barrier", "poll", "synchronize",
]

Average = hora.Average
Sum = hora.Sum
Min = hora.Min
Max = hora.Max
Product = hora.Product


class _AdasumOp:
    """Horovod's Adasum reduction: not provided by hora. Scripts that name it import; using it
    raises hora.UnsupportedError."""

    def __repr__(self):
        return "Adasum"


Adasum = _AdasumOp()


def _op(average, op):
    """Horovod's op resolution: the deprecated `average` flag or `op`, Average by default."""
    if average is not None and op is not None:
        raise ValueError("hora.torch: pass op or the deprecated average, not both")
    if average is not None:
        return Average if average else Sum
    if op is None:
        return Average
    if op is Adasum:
        raise hora.UnsupportedError("hora.torch: the Adasum reduction is not provided by hora; "
                                    "use Average or Sum", 5)
    return op


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hora.torch: expected a torch.Tensor, got a %s" % type(tensor).__name__)


# --- allreduce ----------------------------------------------------------------------------

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of `tensor` into a new tensor; synchronize(handle) returns it."""
    _check(tensor)
    return hora.allreduce_async(tensor, _op(average, op), prescale_factor, postscale_factor,
                                name, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of `tensor`; synchronize(handle) returns it."""
    _check(tensor)
    return hora.allreduce_async_(tensor, _op(average, op), prescale_factor, postscale_factor,
                                 name, process_set)


class _Allreduce(torch.autograd.Function):
    """Reduction whose gradient is the same reduction of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return hora.allreduce(tensor, op, prescale_factor, postscale_factor, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = hora.allreduce(grad.contiguous(), ctx.op, ctx.pre, ctx.post, None,
                                 ctx.process_set)
        return reduced, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of `tensor` over the ranks of the set (Average by default), as a new
    tensor; differentiable. `compression` applies on the wire only."""
    _check(tensor)
    op = _op(average, op)
    wire, ctx = compression.compress(tensor)
    out = _Allreduce.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    for t in tensors:
        _check(t)
    return hora.grouped_allreduce_async(list(tensors), _op(average, op), prescale_factor,
                                        postscale_factor, name, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    for t in tensors:
        _check(t)
    return hora.grouped_allreduce_async_(list(tensors), _op(average, op), prescale_factor,
                                         postscale_factor, name, process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one unit (negotiated, fused and completed together); returns
    new tensors."""
    wires = [compression.compress(t) for t in tensors]
    outs = synchronize(grouped_allreduce_async([w for w, _ in wires], average, name, op,
                                               prescale_factor, postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, wires)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# --- allgather, broadcast -----------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    _check(tensor)
    return hora.allgather_async(tensor, name, process_set)


class _Allgather(torch.autograd.Function):
    """Concatenation over ranks; the gradient of this rank's rows is the sum over ranks of the
    output's gradient at those rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return hora.allgather(tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        summed = hora.allreduce(grad.contiguous(), Sum, 1.0, 1.0, None, ctx.process_set)
        rows = hora.allgather(torch.tensor([ctx.rows], dtype=torch.int64), None, ctx.process_set)
        me = ctx.process_set.rank() if isinstance(ctx.process_set, hora.ProcessSet) else hora.rank()
        start = int(rows[:me].sum())
        return summed.narrow(0, start, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension (which may differ between
    ranks); differentiable."""
    _check(tensor)
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, all in flight at once."""
    handles = [allgather_async(t, None if name is None else "%s.%d" % (name, i), process_set)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check(tensor)
    return hora.broadcast_async(tensor, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check(tensor)
    return hora.broadcast_async_(tensor, root_rank, name, process_set)


class _Broadcast(torch.autograd.Function):
    """Copy of the root's tensor; the gradient reaches the root only, summed over ranks."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return hora.broadcast(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        summed = hora.allreduce(grad.contiguous(), Sum, 1.0, 1.0, None, ctx.process_set)
        me = ctx.process_set.rank() if isinstance(ctx.process_set, hora.ProcessSet) else hora.rank()
        if me != ctx.root:
            summed = summed * 0
        return summed, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """The root's `tensor`, as a new tensor on every rank; differentiable."""
    _check(tensor)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Copies the root's `tensor` into `tensor` on every rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- alltoall, reducescatter --------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """synchronize(handle) gives (output, received_splits)."""
    _check(tensor)
    return hora.alltoall_async(tensor, splits, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """splits[i] rows of `tensor` go to rank i of the set (an even split when None). Returns the
    rows received, in rank order; with `splits`, (output, received_splits)."""
    _check(tensor)
    return hora.alltoall(tensor, splits, name, process_set)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    _check(tensor)
    return hora.reducescatter_async(tensor, _op(None, op), name, process_set, prescale_factor,
                                    postscale_factor)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set; rank i gets the i-th block of rows (rows // size each, the
    first rows % size ranks one more)."""
    wire, ctx = compression.compress(tensor)
    out = synchronize(reducescatter_async(wire, name, op, process_set, prescale_factor,
                                          postscale_factor))
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, all in flight at once."""
    wires = [compression.compress(t) for t in tensors]
    handles = [reducescatter_async(w, None if name is None else "%s.%d" % (name, i), op,
                                   process_set, prescale_factor, postscale_factor)
               for i, (w, _) in enumerate(wires)]
    return [compression.decompress(synchronize(h), ctx) for h, (_, ctx) in zip(handles, wires)]


def join(device=-1, process_set=global_process_set):
    """This rank has no more data; blocks until every rank has joined and returns the last rank
    to join. `device` is accepted for Horovod's sake (hora needs no device for this)."""
    del device
    return _join(process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it."""
    _barrier(process_set)
