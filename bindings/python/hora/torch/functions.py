# SPDX-License-Identifier: Apache-2.0
"""Model and optimizer state across ranks, as in horovod.torch: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object."""

import io
import pickle

import torch

from hora import ProcessSet, global_process_set

from .mpi_ops import allgather, broadcast_, broadcast_async_, synchronize

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies the root's parameters into every rank's, in place. `params`: a state_dict, the
    (name, tensor) pairs of named_parameters(), or a list of tensors. Every broadcast is in
    flight at once."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and isinstance(items[0], torch.Tensor):
            items = [("param.%d" % i, p) for i, p in enumerate(items)]
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError("hora.torch.broadcast_parameters: %r is a %s, not a tensor"
                             % (name, type(p).__name__))
        handles.append(broadcast_async_(p, root_rank, "broadcast.param.%s" % name, process_set))
    for h in handles:
        synchronize(h)


def _tensor_skeleton(obj, tensors):
    """`obj` with every tensor replaced by its index in `tensors` (collected in order)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _tensor_skeleton(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tensor_skeleton(v, tensors) for v in obj)
    return obj


def _fill_skeleton(obj, tensors):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_skeleton(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill_skeleton(v, tensors) for v in obj)
    return obj


class _TensorSlot:
    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (per-parameter state such as momentum buffers and
    step counts, and the param_groups' options such as lr) the root's.

    As in Horovod: when the root's optimizer has no state yet, every rank first initializes its
    own by one step with zero gradients (so that e.g. Adam's buffers exist and its step counts
    run as Horovod's); afterwards every parameter that requires a gradient has a .grad (zeros
    where it had none; sparse for SparseAdam, and for SGD on the sparse embeddings of `model`).
    Gradients a parameter already had are kept.

    The root's state_dict travels as a skeleton (its scalars, and each tensor's shape and
    dtype); the tensors themselves go by hora broadcasts into buffers of that shape, so ranks
    whose optimizer has not stepped yet (empty state) receive the root's too. `process_set`
    (hora's addition; also accepted in `model`'s place) limits it to the ranks of a set."""
    if isinstance(model, ProcessSet):
        model, process_set = None, model
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("hora.torch.broadcast_optimizer_state: LBFGS keeps no broadcastable "
                         "state; broadcast the parameters instead")
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    sparse = _sparse_parameters(optimizer, model)
    root_empty = torch.tensor([int(len(optimizer.state_dict()["state"]) == 0)], dtype=torch.int64)
    broadcast_(root_empty, root_rank, "broadcast.optimizer.empty", process_set)
    if int(root_empty):
        kept = [p.grad for p in params]
        for p in params:
            p.grad = _zeros_for(p, sparse)
        if getattr(optimizer, "_hora_distributed", False):
            # the wrapped optimizer's own step: no gradient reduction (this is no training step)
            super(type(optimizer), optimizer).step()
        else:
            optimizer.step()
        for p, grad in zip(params, kept):
            if grad is not None:
                p.grad = grad
    for p in params:
        if p.grad is None:
            p.grad = _zeros_for(p, sparse)

    mine = []
    skeleton = _tensor_skeleton(optimizer.state_dict(), mine)
    skeleton = broadcast_object(skeleton, root_rank, "broadcast.optimizer.skeleton", process_set)
    slots = []
    _collect_slots(skeleton, slots)
    buffers = []
    for slot in sorted(slots, key=lambda s: s.index):
        local = mine[slot.index] if slot.index < len(mine) else None
        if (local is None or tuple(local.shape) != slot.shape or local.dtype != slot.dtype):
            local = torch.empty(slot.shape, dtype=slot.dtype)
        else:
            local = local.detach().clone()
        buffers.append(local)
    handles = [broadcast_async_(b, root_rank, "broadcast.optimizer.state.%d" % i, process_set)
               for i, b in enumerate(buffers)]
    for h in handles:
        synchronize(h)
    optimizer.load_state_dict(_fill_skeleton(skeleton, buffers))


def _sparse_parameters(optimizer, model):
    """Ids of the parameters whose zero gradient must be sparse (Horovod's rule)."""
    if isinstance(optimizer, torch.optim.SparseAdam):
        return {id(p) for group in optimizer.param_groups for p in group["params"]}
    if model is None or not isinstance(optimizer, torch.optim.SGD):
        return set()
    return {id(p) for m in model.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
            for p in m.parameters()}


def _zeros_for(p, sparse):
    zeros = torch.zeros_like(p, memory_format=torch.contiguous_format)
    # every dimension sparse, as Horovod's (torch's SparseAdam cannot step on an empty
    # gradient with dense dimensions)
    return zeros.to_sparse() if id(p) in sparse else zeros


def _collect_slots(obj, out):
    if isinstance(obj, _TensorSlot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)


def _to_bytes(obj):
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(tensor):
    return pickle.loads(tensor.numpy().tobytes())


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """The root's `obj` (anything picklable) on every rank."""
    name = name or "broadcast_object"
    payload = _to_bytes(obj)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    broadcast_(length, root_rank, name + ".length", process_set)
    data = payload if payload.numel() == int(length) else torch.empty(int(length), dtype=torch.uint8)
    broadcast_(data, root_rank, name + ".data", process_set)
    return _from_bytes(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj` (anything picklable), as a list in rank order."""
    name = name or "allgather_object"
    payload = _to_bytes(obj)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name + ".lengths",
                        process_set)
    data = allgather(payload, name + ".data", process_set)
    out, at = [], 0
    for n in lengths.tolist():
        out.append(_from_bytes(data[at:at + n]))
        at += n
    return out
