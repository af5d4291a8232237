# SPDX-License-Identifier: Apache-2.0
"""horovod.torch's collectives on hora, with Horovod's semantics, for torch tensors of any dtype
hora carries (bfloat16 included) on the CPU, or on CUDA with NCCL. Results keep the input's
dtype and device.

What hora.torch does on top of hora's collectives (docs/horovod.md says why):
- Average is Sum with postscale_factor / (the process set's size), as in Horovod: it divides by
  the set's size even while ranks have joined.
- Integer tensors take Average and scale factors: hora sums them, and hora.torch applies the
  factors in float64, truncating toward zero as Horovod does and saturating to the dtype's
  range. prescale_factor scales each rank's input, postscale_factor
  the sum.
- reducescatter's factors are applied here (float16 and bfloat16 multiplied in float32).
- broadcast's root_rank is a global rank, also for a process set.
- allreduce, grouped_allreduce, allgather, grouped_allgather, broadcast, alltoall,
  reducescatter and grouped_reducescatter are differentiable, with Horovod's gradients.
- An op that this rank refuses before hora takes it (a non-tensor, Adasum, a root outside the
  set, ...) is announced to the set's other ranks, whose op of that name then fails at once
  instead of waiting for this rank.
"""

import functools
import inspect
import math

import torch

import hora
from hora import (HoraError, ProcessSet, global_process_set, poll, synchronize,
                  join as _join, barrier as _barrier)
from hora.process_sets import set_id as _set_id

from .compression import Compression

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll",
    "synchronize",
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


# --- refusals: errors this rank raises before hora takes the op -----------------------------

_REFUSED = "_hora_torch_refused"    # set on the HoraErrors hora.torch raises itself
_ANNOUNCED = "_hora_torch_announced"  # set once the other ranks have been told


def _refusal(cls, message):
    """An exception of hora.torch's own (unlike the HoraErrors of hora's C layer, which tells
    the other ranks by itself)."""
    error = cls(message)
    setattr(error, _REFUSED, True)
    return error


def _announces(op, grouped=False):
    """Decorates an op of hora.torch whose refusal by this rank must reach the set's other
    ranks. An exception raised before hora's C layer took the op (anything but the C layer's
    own HoraErrors) is passed to hora_reject under the op's name ("" when it is named by call
    order, which uses that name up as a submission would), so that the op fails on the others
    too, naming this rank and its reason, instead of waiting for it. `grouped`: the op is one
    hora op per tensor of its `tensors` argument, each refused."""

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                if not getattr(error, _ANNOUNCED, False) and (
                        not isinstance(error, HoraError) or getattr(error, _REFUSED, False)):
                    _announce(op, grouped, signature, args, kwargs, error)
                raise
        return call
    return decorate


def _announce(op, grouped, signature, args, kwargs, error):
    try:
        setattr(error, _ANNOUNCED, True)
    except AttributeError:
        pass
    reject = getattr(hora._hora, "reject", None)  # pylint: disable=protected-access
    if reject is None:
        return
    try:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
    except TypeError:  # the call itself was malformed: the defaults say which op it replaces
        arguments = {k: p.default for k, p in signature.parameters.items()}
    process_set = arguments.get("process_set", global_process_set)
    ps = process_set.process_set_id if isinstance(process_set, ProcessSet) else process_set
    if not isinstance(ps, int):
        return  # an unregistered set: there is nobody to tell
    count = 1
    if grouped:
        try:
            count = max(1, len(arguments.get("tensors")))
        except TypeError:
            count = 1
    name = arguments.get("name")
    names = _member_names(name, count) if grouped else [name]
    for member in names:
        reject(op, "" if member is None else str(member), ps, str(error))


def _op(average, op):
    """Horovod's op resolution: the deprecated `average` flag or `op`, Average by default."""
    if average is not None and op is not None:
        raise ValueError("hora.torch: pass op or the deprecated average, not both")
    if average is not None:
        return Average if average else Sum
    if op is None:
        return Average
    if op is Adasum:
        raise _refusal(hora.UnsupportedError, "hora.torch: the Adasum reduction is not "
                       "provided by hora; use Average or Sum")
    if op not in (Sum, Average, Min, Max, Product):
        raise ValueError("hora.torch: unknown reduction op %r (Sum, Average, Min, Max, "
                         "Product)" % (op,))
    return op


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hora.torch: expected a torch.Tensor, got a %s" % type(tensor).__name__)


def _check_all(tensors):
    if isinstance(tensors, torch.Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError("hora.torch: expected a list of torch.Tensors, got a %s"
                        % type(tensors).__name__)
    tensors = list(tensors)
    for t in tensors:
        _check(t)
    return tensors


def _member_names(name, count):
    """The names of a grouped op's hora ops (None: each named by call order)."""
    return [None if name is None else "%s.%d" % (name, i) for i in range(count)]


# --- process sets -----------------------------------------------------------------------------

def _set_size(process_set):
    return hora._hora.process_set_size(_set_id(process_set))  # pylint: disable=protected-access


def _set_rank(process_set):
    return hora._hora.process_set_rank(_set_id(process_set))  # pylint: disable=protected-access


def _root_in_set(root_rank, process_set):
    """Horovod's root_rank (a global rank) as the rank within the set that hora takes."""
    root = int(root_rank)
    if isinstance(process_set, ProcessSet):
        if process_set.ranks is None:
            return root
        if root not in process_set.ranks:
            raise ValueError("hora.torch: broadcast root_rank %d is not a member of %r "
                             "(root_rank is a global rank, as in Horovod)" % (root, process_set))
        return process_set.ranks.index(root)
    if _set_id(process_set) == 0:
        return root
    raise ValueError("hora.torch: broadcast on process set id %r: pass the ProcessSet, whose "
                     "ranks translate the global root_rank" % (process_set,))


# --- scaling done here rather than in hora ----------------------------------------------------

def _is_integer(t):
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _to_integer(x, dtype):
    """float64 x truncated toward zero (Horovod's C++ conversion) and saturated to the integer
    dtype's range; NaN gives 0."""
    info = torch.iinfo(dtype)
    top = float(info.max)
    if top > info.max:  # int64: 2**63 is past the end; the largest double below it
        top = math.nextafter(top, 0.0)
    x = torch.trunc(torch.nan_to_num(x, nan=0.0))
    out = x.clamp(float(info.min), top).to(dtype)
    if top < info.max:
        out.masked_fill_(x > top, info.max)
    return out


def _scaled(t, factor):
    """t * factor in t's dtype: integers through float64 (truncated toward zero, saturated);
    float16 and bfloat16 multiplied in float32 and the product rounded to the dtype, as Horovod
    computes it (torch's half * Python float rounds the factor to half first: up to 1 ulp off);
    other floats in their own dtype."""
    if factor == 1.0:
        return t
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.float() * factor).to(t.dtype)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t * factor
    return _to_integer(t.double() * factor, t.dtype)


def _reduction(tensors, op, prescale_factor, postscale_factor, process_set):
    """(op for hora, prescale, postscale, whether hora.torch scales): Average is Sum with
    postscale / the set's size; integers are scaled here, bool never."""
    pre, post = float(prescale_factor), float(postscale_factor)
    scales = op == Average or pre != 1.0 or post != 1.0
    if scales and any(t.dtype == torch.bool for t in tensors):
        raise _refusal(hora.UnsupportedError, "hora.torch: Average and scale factors do not "
                       "apply to bool tensors; use Sum (logical or), Min or Max")
    if op == Average:
        size = _set_size(process_set)
        if size > 0:  # else an unknown set, which hora's own error names
            op, post = Sum, post / size
    if any(t.dtype == torch.bool for t in tensors):  # sent as uint8 0/1 (_core): OR, AND
        op = {Sum: Max, Product: Min}.get(op, op)
    return op, pre, post, scales and any(_is_integer(t) for t in tensors)


def _then(handle, finish):
    """A handle whose result is finish(result of `handle`)."""
    return hora.Handle(handle, lambda h: finish(h.wait()))


class _Requests:
    """The hora ops of one hora.torch op (a grouped allgather, reducescatter): complete once all
    have; wait() waits for every one before raising the first error, so none is left behind."""

    def __init__(self, handles):
        self.handles = handles

    def poll(self):
        return all(h.poll() for h in self.handles)

    def wait(self):
        failure = None
        for h in self.handles:
            try:
                h.wait()
            except HoraError as error:
                failure = failure or error
        if failure is not None:
            raise failure
        return [h.wait() for h in self.handles]


def _all(handles):
    return hora.Handle(_Requests(handles), lambda r: r.wait())


def _core(start, tensor, *args, in_place=False):
    """hora's start(tensor, *args) (tensor: one, or a group's list). torch cannot export bool
    through DLPack: a bool tensor goes as its bytes, uint8 0 or 1 (hora's bool layout, which
    Max and Min reduce as OR and AND), and its result comes back as bool."""
    group = isinstance(tensor, list)
    members = tensor if group else [tensor]
    bools = [t.dtype == torch.bool for t in members]
    if not any(bools):
        return start(tensor, *args)
    wire = [t.view(torch.uint8) if b else t for t, b in zip(members, bools)]
    handle = start(wire if group else wire[0], *args)
    if in_place:
        return _then(handle, lambda _: tensor)

    def as_bool(result):
        if isinstance(result, tuple):  # alltoall's (output, received_splits)
            return (as_bool(result[0]),) + result[1:]
        if isinstance(result, list):
            return [r.view(torch.bool) if b else r for r, b in zip(result, bools)]
        return result.view(torch.bool)
    return _then(handle, as_bool)


# --- allreduce ----------------------------------------------------------------------------

def _allreduce_start(tensor, in_place, op, name, prescale_factor, postscale_factor,
                     process_set):
    op, pre, post, here = _reduction([tensor], op, prescale_factor, postscale_factor,
                                     process_set)
    if not here:
        start = hora.allreduce_async_ if in_place else hora.allreduce_async
        return _core(start, tensor, op, pre, post, name, process_set, in_place=in_place)
    handle = hora.allreduce_async(_scaled(tensor, pre), op, 1.0, 1.0, name, process_set)
    if in_place:
        return _then(handle, lambda out: tensor.copy_(_scaled(out, post)))
    return _then(handle, lambda out: _scaled(out, post))


@_announces("allreduce")
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of `tensor` into a new tensor; synchronize(handle) returns it."""
    _check(tensor)
    return _allreduce_start(tensor, False, _op(average, op), name, prescale_factor,
                            postscale_factor, process_set)


@_announces("allreduce")
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of `tensor`; synchronize(handle) returns it."""
    _check(tensor)
    return _allreduce_start(tensor, True, _op(average, op), name, prescale_factor,
                            postscale_factor, process_set)


class _Allreduce(torch.autograd.Function):
    """Horovod's gradient: the same reduction (op and factors) of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(_allreduce_start(tensor, False, op, name, prescale_factor,
                                            postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        reduced = synchronize(_allreduce_start(grad.contiguous(), False, op, None, pre, post,
                                               process_set))
        return reduced, None, None, None, None, None


@_announces("allreduce")
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


def _grouped_allreduce_start(tensors, in_place, op, name, prescale_factor, postscale_factor,
                             process_set):
    op, pre, post, here = _reduction(tensors, op, prescale_factor, postscale_factor,
                                     process_set)
    if not here:
        start = hora.grouped_allreduce_async_ if in_place else hora.grouped_allreduce_async
        return _core(start, tensors, op, pre, post, name, process_set, in_place=in_place)
    handle = hora.grouped_allreduce_async([_scaled(t, pre) for t in tensors], op, 1.0, 1.0,
                                          name, process_set)
    if in_place:
        return _then(handle, lambda outs: [t.copy_(_scaled(o, post))
                                           for t, o in zip(tensors, outs)])
    return _then(handle, lambda outs: [_scaled(o, post) for o in outs])


@_announces("grouped_allreduce")
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one unit into new tensors; synchronize(handle)
    returns the list."""
    tensors = _check_all(tensors)
    return _grouped_allreduce_start(tensors, False, _op(average, op), name, prescale_factor,
                                    postscale_factor, process_set)


@_announces("grouped_allreduce")
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """As grouped_allreduce_async, in place."""
    tensors = _check_all(tensors)
    return _grouped_allreduce_start(tensors, True, _op(average, op), name, prescale_factor,
                                    postscale_factor, process_set)


class _GroupedAllreduce(torch.autograd.Function):
    """Horovod's gradient: the same grouped reduction of the outputs' gradients."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(_grouped_allreduce_start(
            list(tensors), False, op, name, prescale_factor, postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        reduced = synchronize(_grouped_allreduce_start([g.contiguous() for g in grads], False,
                                                       op, None, pre, post, process_set))
        return (None, None, None, None, None) + tuple(reduced)


@_announces("grouped_allreduce")
def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one unit (negotiated, fused and completed together); returns
    new tensors; differentiable."""
    tensors = _check_all(tensors)
    op = _op(average, op)
    wires = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[w for w, _ in wires])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, wires)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors in place as one unit; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# --- allgather --------------------------------------------------------------------------------

@_announces("allgather")
def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather of `tensor`; synchronize(handle) returns the concatenation."""
    _check(tensor)
    return _core(hora.allgather_async, tensor, name, process_set)


class _Allgather(torch.autograd.Function):
    """Horovod's gradient: the output's gradient averaged over the set, at this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set, ctx.shape = process_set, tensor.shape
        return synchronize(_core(hora.allgather_async, tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        mine = _gathered_rows([grad], [ctx.shape], ctx.process_set)[0]
        return mine, None, None


def _gathered_rows(grads, shapes, process_set):
    """Horovod's allgather gradient of each output: its gradient averaged over the set (one
    grouped allreduce), at the rows that came from this rank (`shapes`: this rank's inputs)."""
    averaged = synchronize(_grouped_allreduce_start([g.contiguous() for g in grads], False,
                                                    Average, None, 1.0, 1.0, process_set))
    rows = [s[0] for s in shapes]
    everyone = synchronize(hora.allgather_async(torch.tensor([rows], dtype=torch.int64), None,
                                                process_set))
    starts = everyone[:_set_rank(process_set)].sum(dim=0)
    return [a.narrow(0, int(start), n) for a, start, n in zip(averaged, starts, rows)]


@_announces("allgather")
def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension (which may differ between
    ranks); differentiable."""
    _check(tensor)
    return _Allgather.apply(tensor, name, process_set)


@_announces("allgather", grouped=True)
def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of each tensor, all in flight at once; synchronize(handle) returns
    the list of concatenations."""
    tensors = _check_all(tensors)
    _set_id(process_set)  # an unregistered set fails before any member is submitted
    return _all([_core(hora.allgather_async, t, n, process_set)
                 for t, n in zip(tensors, _member_names(name, len(tensors)))])


class _GroupedAllgather(torch.autograd.Function):
    """Horovod's gradient, per tensor: as allgather's."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set, ctx.shapes = process_set, [t.shape for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + tuple(_gathered_rows(grads, ctx.shapes, ctx.process_set))


@_announces("allgather", grouped=True)
def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, all in flight at once; differentiable."""
    tensors = _check_all(tensors)
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# --- broadcast --------------------------------------------------------------------------------

@_announces("broadcast")
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of the root's `tensor` into a new tensor. root_rank is a global rank,
    also for a process set (as in Horovod)."""
    _check(tensor)
    return _core(hora.broadcast_async, tensor, _root_in_set(root_rank, process_set), name,
                 process_set)


@_announces("broadcast")
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying the root's `tensor` into `tensor` on every rank of the set."""
    _check(tensor)
    return _core(hora.broadcast_async_, tensor, _root_in_set(root_rank, process_set), name,
                 process_set, in_place=True)


class _Broadcast(torch.autograd.Function):
    """Horovod's gradient: the output's gradient averaged over the set, at the root only (the
    root being a global rank, this process's global rank decides)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = int(root_rank), process_set
        return synchronize(_core(hora.broadcast_async, tensor,
                                 _root_in_set(root_rank, process_set), name, process_set))

    @staticmethod
    def backward(ctx, grad):
        averaged = synchronize(_allreduce_start(grad.contiguous(), False, Average, None, 1.0,
                                                1.0, ctx.process_set))
        if hora.rank() != ctx.root:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


@_announces("broadcast")
def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """The root's `tensor`, as a new tensor on every rank; differentiable."""
    _check(tensor)
    _root_in_set(root_rank, process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Copies the root's `tensor` into `tensor` on every rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- alltoall ---------------------------------------------------------------------------------

def _split_list(splits):
    """alltoall's splits as Python ints: an integer tensor or a sequence of integers (a float
    tensor is refused, as Horovod refuses non-int32 splits, rather than truncated)."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise ValueError("hora.torch.alltoall: splits must be an integer tensor, not %s"
                             % splits.dtype)
        splits = splits.reshape(-1).tolist()
    out = []
    for s in splits:
        if isinstance(s, bool) or not float(s).is_integer() or abs(int(s)) >= 2 ** 63:
            raise ValueError("hora.torch.alltoall: splits must be integers in int64's range; "
                             "got %r" % (s,))
        out.append(int(s))
    return out


@_announces("alltoall")
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize(handle) gives (output, received_splits)."""
    _check(tensor)
    return _core(hora.alltoall_async, tensor, _split_list(splits), name, process_set)


class _Alltoall(torch.autograd.Function):
    """Horovod's gradient: the output's gradient sent back where its rows came from (an
    alltoall with the received splits). received_splits is not differentiable."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(_core(hora.alltoall_async, tensor, _split_list(splits),
                                             name, process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *_):
        back, _ = synchronize(hora.alltoall_async(grad.contiguous(), _split_list(ctx.received),
                                                  None, ctx.process_set))
        return back, None, None, None


@_announces("alltoall")
def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """splits[i] rows of `tensor` go to rank i of the set (an even split when None). Returns the
    rows received, in rank order; with `splits`, (output, received_splits). Differentiable."""
    _check(tensor)
    splits = _split_list(splits)
    return _Alltoall.apply(tensor, splits, name, process_set)


# --- reducescatter ----------------------------------------------------------------------------

def _reducescatter_start(tensor, name, op, process_set, prescale_factor, postscale_factor):
    """hora's reducescatter takes no factors: they are applied here, around its Sum."""
    op, pre, post, _ = _reduction([tensor], _op(None, op), prescale_factor, postscale_factor,
                                  process_set)
    handle = _core(hora.reducescatter_async, _scaled(tensor, pre), op, name, process_set)
    return handle if post == 1.0 else _then(handle, lambda out: _scaled(out, post))


@_announces("reducescatter")
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; synchronize(handle) returns this rank's block."""
    _check(tensor)
    return _reducescatter_start(tensor, name, op, process_set, prescale_factor,
                                postscale_factor)


def _reducescatter_grads(grads, op, prescale_factor, postscale_factor, process_set):
    """Horovod's reducescatter gradient: the blocks' gradients, times the set's size for Sum
    and times the factors, gathered (one allgather each, all in flight)."""
    factor = float(prescale_factor) * float(postscale_factor)
    if op == Sum:
        factor *= _set_size(process_set)
    return synchronize(_all([hora.allgather_async((g * factor).contiguous(), None, process_set)
                             for g in grads]))


class _Reducescatter(torch.autograd.Function):
    """Horovod's gradient: see _reducescatter_grads."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(_reducescatter_start(tensor, name, op, process_set, prescale_factor,
                                                postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        return (_reducescatter_grads([grad], *ctx.args)[0], None, None, None, None, None)


@_announces("reducescatter")
def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set; rank i gets the i-th block of rows (rows // size each, the
    first rows % size ranks one more). Differentiable."""
    _check(tensor)
    op = _op(None, op)
    wire, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(wire, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


@_announces("reducescatter", grouped=True)
def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of each tensor, all in flight at once; synchronize(handle)
    returns the list of this rank's blocks."""
    tensors = _check_all(tensors)
    op = _op(None, op)
    _reduction(tensors, op, prescale_factor, postscale_factor, process_set)  # refusals first
    return _all([_reducescatter_start(t, n, op, process_set, prescale_factor, postscale_factor)
                 for t, n in zip(tensors, _member_names(name, len(tensors)))])


class _GroupedReducescatter(torch.autograd.Function):
    """Horovod's gradient, per tensor: as reducescatter's."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * 5 + tuple(_reducescatter_grads(grads, *ctx.args))


@_announces("reducescatter", grouped=True)
def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, all in flight at once; differentiable."""
    tensors = _check_all(tensors)
    op = _op(None, op)
    wires = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                       *[w for w, _ in wires])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, wires)]


# --- join, barrier ----------------------------------------------------------------------------

def join(device=-1, process_set=global_process_set):
    """This rank has no more data; blocks until every rank has joined and returns the last rank
    to join. `device` is accepted for Horovod's sake (hora needs no device for this)."""
    del device
    return _join(process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it."""
    _barrier(process_set)
