# SPDX-License-Identifier: Apache-2.0
"""hora's collectives on numpy arrays, torch tensors and other DLPack producers.

Every collective has a blocking form and an ``_async`` form that returns a Handle; names ending
in ``_`` work in place. Results have the input's type, dtype and device. hora matches ops across
ranks by name (``name=None``: by call order within the process set).
"""

import sys

from . import _hora
from .process_sets import global_process_set, set_id

__all__ = [
    "Sum", "Average", "Min", "Max", "Product", "ReduceOp", "Handle", "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "barrier", "join",
]


class ReduceOp:
    """The reduction of allreduce and reducescatter (the C API's hora_reduce_op_t)."""
    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class Handle:
    """One collective in flight. ``poll()`` never blocks; ``wait()`` blocks with the GIL
    released, then returns the op's result or raises its error (again on every call).
    ``wait(stream)`` on CUDA tensors is stream-ordered, as torch's ``work.wait()``: it returns
    once the op is queued on the GPU, `stream` waiting for its end (see ``synchronize``)."""

    __slots__ = ("_request", "_finish", "_result", "_done")

    def __init__(self, request, finish):
        self._request = request
        self._finish = finish
        self._result = None
        self._done = False

    def poll(self):
        return self._done or self._request.poll()

    def wait(self, stream=None):
        if stream is not None:
            self.wait_on_stream(getattr(stream, "cuda_stream", stream))
        elif not self._done:
            self._request.wait()
            self._result = self._finish(self._request)
            self._done = True
        return self._result

    def wait_on_stream(self, stream):
        """`stream`: a cudaStream_t as an int (what hora's Request takes too)."""
        if not self._done:
            self._request.wait_on_stream(stream)
            self._result = self._finish(self._request)
            self._done = True


def poll(handle):
    """True once the op of `handle` has completed (successfully or not)."""
    return handle.poll()


def synchronize(handle, stream=None):
    """Waits for the op of `handle` and returns its result.

    stream: None (the default) waits on the host until the result is on the device. A
    ``torch.cuda.Stream`` (e.g. ``torch.cuda.current_stream()``) or a cudaStream_t as an int
    makes the wait stream-ordered, for CUDA tensors: it returns as soon as the op is queued on
    the GPU, with that stream waiting for it, so work queued on the stream afterwards sees the
    result and the host does not wait for the GPU (torch's ``work.wait()`` on NCCL). A failure
    the GPU reports later is then not raised here; ``poll(handle)`` still becomes true. For
    CPU tensors both are the same host wait."""
    return handle.wait(stream)


# --- tensors of each framework ------------------------------------------------------------

def _torch():
    return sys.modules.get("torch")


def _is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x):
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(x, numpy.ndarray)


def _buffer(x, writes):
    """(what hora reads or writes, a function copying the result back into x or None).

    hora needs compact memory: a non-contiguous tensor goes through a contiguous copy. torch
    tensors are detached (DLPack refuses tensors that require grad; the storage is shared)."""
    if _is_torch(x):
        plain = x.detach()
        if plain.is_contiguous():
            return plain, None
        copy = plain.contiguous()
        return copy, (lambda: plain.copy_(copy)) if writes else None
    if _is_numpy(x):
        import numpy  # pylint: disable=import-outside-toplevel
        if writes and not x.flags.writeable:
            raise ValueError("hora: an in-place op on a read-only numpy array")
        if x.flags.c_contiguous and x.flags.writeable:
            return x, None
        # numpy cannot export read-only arrays through DLPack: those are copied too
        copy = numpy.array(x, order="C", copy=True)
        return copy, (lambda: numpy.copyto(x, copy)) if writes else None
    return x, None


def _empty_like(x):
    if _is_torch(x):
        return _torch().empty_like(x, memory_format=_torch().contiguous_format)
    if _is_numpy(x):
        import numpy  # pylint: disable=import-outside-toplevel
        return numpy.empty_like(x, order="C")
    if not hasattr(x, "__dlpack__"):
        raise TypeError("hora: a %s is not a tensor (it has no __dlpack__): pass a numpy array "
                        "or a torch tensor" % type(x).__name__)
    raise TypeError("hora: hora cannot allocate a result like a %s: use the in-place form of "
                    "the op (allreduce_, broadcast_, ...)" % type(x).__name__)


def _copy(x):
    if _is_torch(x):
        return x.detach().clone(memory_format=_torch().contiguous_format)
    out = _empty_like(x)
    out[...] = x
    return out


def _imported(like, output):
    """hora's output tensor as the framework of `like` (no copy)."""
    if _is_torch(like):
        from torch.utils import dlpack  # pylint: disable=import-outside-toplevel
        return dlpack.from_dlpack(output)
    if _is_numpy(like):
        import numpy  # pylint: disable=import-outside-toplevel
        return numpy.asarray(output)  # writable, unlike numpy.from_dlpack's arrays
    return output


def _int64s(like, values):
    if _is_torch(like):
        return _torch().tensor(values, dtype=_torch().int64)
    import numpy  # pylint: disable=import-outside-toplevel
    return numpy.asarray(values, dtype=numpy.int64)


def _use_stream(x):
    """CUDA tensors: hora's NCCL work waits for the work queued so far on torch's current
    stream of the tensor's device."""
    if _is_torch(x) and x.is_cuda:
        stream = _torch().cuda.current_stream(x.device)
        _hora.cuda_set_stream(stream.cuda_stream)


def _name(name):
    return "" if name is None else str(name)


def _scaled(x, factor):
    """x * factor as a new tensor of x's dtype (reducescatter's pre- and postscale, which the C
    API does not take)."""
    out = _copy(x)
    out *= factor
    return out


# --- collectives ---------------------------------------------------------------------------

def allreduce_async(tensor, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                    process_set=global_process_set):
    """Starts a reduction of `tensor` over the ranks of the set into a new tensor. The result is
    (op over ranks of tensor * prescale_factor) * postscale_factor; Average divides by the set's
    size."""
    source, _ = _buffer(tensor, writes=False)
    output = _empty_like(source)
    _use_stream(source)
    request = _hora.allreduce(source, output, int(op), float(prescale_factor),
                              float(postscale_factor), set_id(process_set), _name(name))
    return Handle(request, lambda _: output)


def allreduce_async_(tensor, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                     process_set=global_process_set):
    """As allreduce_async, in place: the result replaces `tensor`."""
    buffer, copy_back = _buffer(tensor, writes=True)
    _use_stream(buffer)
    request = _hora.allreduce(buffer, buffer, int(op), float(prescale_factor),
                              float(postscale_factor), set_id(process_set), _name(name))
    return Handle(request, _finisher(tensor, copy_back))


def _finisher(result, copy_back):
    def finish(_):
        if copy_back is not None:
            copy_back()
        return result
    return finish


def allreduce(tensor, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set):
    """The reduction of `tensor` over the ranks of the set, as a new tensor."""
    return allreduce_async(tensor, op, prescale_factor, postscale_factor, name,
                           process_set).wait()


def allreduce_(tensor, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
               process_set=global_process_set):
    """Reduces `tensor` in place over the ranks of the set; returns it."""
    return allreduce_async_(tensor, op, prescale_factor, postscale_factor, name,
                            process_set).wait()


def grouped_allreduce_async(tensors, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                            name=None, process_set=global_process_set):
    """Reduces a list of tensors as one unit (negotiated, fused and completed together) into new
    tensors."""
    sources = [_buffer(t, writes=False)[0] for t in tensors]
    outputs = [_empty_like(s) for s in sources]
    for s in sources:
        _use_stream(s)
    request = _hora.grouped_allreduce(sources, outputs, int(op), float(prescale_factor),
                                      float(postscale_factor), set_id(process_set), _name(name))
    return Handle(request, lambda _: outputs)


def grouped_allreduce_async_(tensors, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                             name=None, process_set=global_process_set):
    """As grouped_allreduce_async, in place."""
    tensors = list(tensors)
    prepared = [_buffer(t, writes=True) for t in tensors]
    buffers = [b for b, _ in prepared]
    for b in buffers:
        _use_stream(b)
    request = _hora.grouped_allreduce(buffers, buffers, int(op), float(prescale_factor),
                                      float(postscale_factor), set_id(process_set), _name(name))

    def finish(_):
        for _, copy_back in prepared:
            if copy_back is not None:
                copy_back()
        return tensors
    return Handle(request, finish)


def grouped_allreduce(tensors, op=Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set):
    return grouped_allreduce_async(tensors, op, prescale_factor, postscale_factor, name,
                                   process_set).wait()


def grouped_allreduce_(tensors, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                       name=None, process_set=global_process_set):
    return grouped_allreduce_async_(tensors, op, prescale_factor, postscale_factor, name,
                                    process_set).wait()


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts gathering `tensor` from every rank of the set, concatenated along the first
    dimension (which may differ between ranks; the others must agree)."""
    source, _ = _buffer(tensor, writes=False)
    _use_stream(source)
    request = _hora.allgather(source, set_id(process_set), _name(name))
    return Handle(request, lambda r: _imported(tensor, r.output()))


def allgather(tensor, name=None, process_set=global_process_set):
    return allgather_async(tensor, name, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying the tensor of `root_rank` (a rank of the set) into `tensor` on every
    other rank."""
    buffer, copy_back = _buffer(tensor, writes=True)
    _use_stream(buffer)
    request = _hora.broadcast(buffer, int(root_rank), set_id(process_set), _name(name))
    return Handle(request, _finisher(tensor, copy_back))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """As broadcast_async_, into a new tensor; `tensor` is left as it is."""
    output = _copy(tensor)
    _use_stream(output)
    request = _hora.broadcast(output, int(root_rank), set_id(process_set), _name(name))
    return Handle(request, lambda _: output)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[i] rows of `tensor` to rank i of the set (an even split when
    None). wait() gives (output, received_splits)."""
    source, _ = _buffer(tensor, writes=False)
    counts = None if splits is None else [int(s) for s in splits]
    ps = set_id(process_set)
    _use_stream(source)
    request = _hora.alltoall(source, counts, ps, _name(name))

    def finish(r):
        received = r.received_splits(_hora.process_set_size(ps))
        return _imported(tensor, r.output()), _int64s(tensor, received)
    return Handle(request, finish)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank of the set sent this one, in rank order; with `splits`, also the
    rows received from each rank: (output, received_splits)."""
    output, received = alltoall_async(tensor, splits, name, process_set).wait()
    return output if splits is None else (output, received)


def reducescatter_async(tensor, op=Average, name=None, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over the set; rank i gets the i-th block of rows (rows // size
    each, the first rows % size ranks one more)."""
    source, _ = _buffer(tensor, writes=False)
    if prescale_factor != 1.0:
        source = _scaled(source, prescale_factor)
    _use_stream(source)
    request = _hora.reducescatter(source, int(op), set_id(process_set), _name(name))

    def finish(r):
        output = _imported(tensor, r.output())
        if postscale_factor != 1.0:
            output *= postscale_factor
        return output
    return Handle(request, finish)


def reducescatter(tensor, op=Average, name=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    return reducescatter_async(tensor, op, name, process_set, prescale_factor,
                               postscale_factor).wait()


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it."""
    _hora.barrier(set_id(process_set))


def join(process_set=global_process_set):
    """This rank has no more data: other ranks' ops complete with zeros for its share. Blocks
    until every rank of the set has joined; returns the last rank to join."""
    return _hora.join(set_id(process_set))
