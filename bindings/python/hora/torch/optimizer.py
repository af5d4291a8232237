# SPDX-License-Identifier: Apache-2.0
"""DistributedOptimizer: wraps a torch optimizer so that every gradient is averaged over the ranks
while backpropagation is still producing the others, as horovod.torch's does.

A hook on each parameter's gradient accumulator submits the gradient to hora the moment it is
accumulated (after `backward_passes_per_step` passes); hora fuses what is ready into large
buffers. step() (or synchronize()) waits for the reductions and then applies the update. Sparse
gradients (nn.Embedding(sparse=True)) are reduced by sparse_allreduce_async, or densely with
sparse_as_dense=True; either way they are sparse again when the wrapped optimizer sees them.

The attributes Horovod's optimizer has and scripts read are here under the same names:
_parameter_names ({parameter: name}), _requires_update, _handles ({parameter: (handle, ctx)}),
_allreduce_delay, backward_passes_per_step (and set_backward_passes_per_step), op,
gradient_predivide_factor, sparse_as_dense, process_set.
"""

import contextlib
import warnings

import torch

import hora
from hora import global_process_set

from .compression import Compression
from .mpi_ops import Adasum, Average, Sum, _op
from .sparse import sparse_allreduce_async

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer(torch.optim.Optimizer):
    # The methods of this class are grafted onto a subclass of the wrapped optimizer's class, so
    # that isinstance() and the optimizer's own step() keep working.

    _hora_distributed = True  # broadcast_optimizer_state steps the wrapped class directly

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step

        params_in_groups = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%d.%d" % (i, j), p)
                                for i, group in enumerate(self.param_groups)
                                for j, p in enumerate(group["params"])]
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
            raise ValueError("hora.torch.DistributedOptimizer: named_parameters must be "
                             "(name, parameter) pairs, as model.named_parameters() gives")
        names = [n for n, _ in named_parameters]
        if len(set(names)) != len(names):
            dups = sorted({n for n in names if names.count(n) > 1})
            raise ValueError("hora.torch.DistributedOptimizer: parameter names must be unique; "
                             "repeated: %s" % ", ".join(dups))
        known = {id(p) for _, p in named_parameters}
        missing = [p for p in params_in_groups if id(p) not in known]
        if missing:
            raise ValueError("hora.torch.DistributedOptimizer: named_parameters lacks %d of the "
                             "optimizer's parameters" % len(missing))
        # Horovod's: parameter -> its name (tensors hash by identity)
        self._parameter_names = {p: n for n, p in named_parameters}
        self._allreduce_delay = {p: backward_passes_per_step for p in params_in_groups}

        # groups: lists of parameters reduced as one grouped allreduce once all are ready
        self._groups = groups
        self._p_to_group = {}
        self._group_members = []
        if groups:
            for g in groups:
                members = [p for p in g if p.requires_grad]
                index = len(self._group_members)
                self._group_members.append(members)
                for p in members:
                    self._p_to_group[p] = index
        self._group_counts = {}  # group index -> parameters of it whose gradient is ready

        self._handles = {}  # parameter -> (handle or None while waiting, context)
        self._sparse_params = {}  # parameter -> sparse_dim of its sparse gradients so far
        self._requires_update = set()
        self._grad_accs = []  # keeps the accumulators (and so the hooks) alive
        self._synchronized = False
        self._should_synchronize = True
        # Before init() every rank would be outside every set and train alone, silently:
        # Horovod raises here (its size() does), and so does this.
        if not hora.is_initialized():
            raise hora.NotInitializedError(
                "hora.torch.DistributedOptimizer: hora has not been initialized; call hvd.init() "
                "before wrapping the optimizer (every rank would otherwise train alone)", 2)
        # A rank outside the optimizer's process set skips every reduction, as in Horovod: its
        # step() applies its own gradients.
        if isinstance(process_set, hora.ProcessSet):
            self._included, self._size = process_set.included(), process_set.size()
        else:  # a process set id
            c_api = hora._hora  # pylint: disable=protected-access
            self._included = c_api.process_set_rank(int(process_set)) >= 0
            self._size = c_api.process_set_size(int(process_set))
        self._reducing = self._included and (self._size > 1 or hora.size() > 1)
        if self._reducing:
            self._register_hooks()

    def _op_name(self, p):
        name = self._parameter_names[p]
        return name if name.startswith("allreduce.") else "allreduce." + name

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                # the accumulator node that writes p.grad: its hook runs once p.grad is final
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def set_backward_passes_per_step(self, passes):
        """Changes backward_passes_per_step (Horovod's method)."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _make_hook(self, p):
        def hook(*_):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "hora.torch: gradients were computed more than backward_passes_per_step "
                    "times before step() or synchronize(); raise backward_passes_per_step "
                    "to accumulate them")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._submit(p)
            else:
                self._handles[p] = (None, None)
        return hook

    def _scales(self):
        """(op for hora, prescale, postscale): Average divides by gradient_predivide_factor
        before the sum and by size / gradient_predivide_factor after."""
        if self.op == Average:
            return (Sum, 1.0 / self.gradient_predivide_factor,
                    self.gradient_predivide_factor / self._size)
        return self.op, 1.0, 1.0

    def _grad(self, p):
        """p.grad, made if there is none: zeros, sparse ones for a parameter whose gradients
        were sparse before (so that every rank submits the same kind of op)."""
        if p.grad is None:
            zeros = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p in self._sparse_params:
                zeros = zeros.to_sparse(self._sparse_params[p])
            p.grad = zeros
        elif p.grad.is_sparse:
            self._sparse_params[p] = p.grad.sparse_dim()
        return p.grad

    def _submit(self, p):
        if p in self._p_to_group:
            index = self._p_to_group[p]
            ready = self._group_counts.setdefault(index, set())
            ready.add(p)
            if len(ready) < len(self._group_members[index]):
                self._handles[p] = (None, None)  # waits for its group
                return
            self._submit_group(index)
            return
        grad = self._grad(p)
        if grad.is_sparse and not self.sparse_as_dense:
            self._handles[p] = (sparse_allreduce_async(grad, self._op_name(p), self.op,
                                                       self.process_set), None)
            return
        dense = grad.to_dense() if grad.is_sparse else grad
        op, pre, post = self._scales()
        wire, ctx = self._compression.compress(dense)
        handle = hora.allreduce_async_(wire, op, pre, post, self._op_name(p), self.process_set)
        self._handles[p] = (handle, (wire, ctx))

    def _submit_group(self, index):
        members = self._group_members[index]
        dense_members = []
        for p in members:
            grad = self._grad(p)
            if grad.is_sparse and not self.sparse_as_dense:
                self._handles[p] = (sparse_allreduce_async(grad, self._op_name(p), self.op,
                                                           self.process_set), None)
            else:
                dense_members.append(p)
        self._group_counts[index] = set()
        if not dense_members:
            return
        op, pre, post = self._scales()
        wires = [self._compression.compress(p.grad.to_dense() if p.grad.is_sparse else p.grad)
                 for p in dense_members]
        handle = hora.grouped_allreduce_async_(
            [w for w, _ in wires], op, pre, post,
            "grouped." + self._op_name(dense_members[0]), self.process_set)
        for p, wc in zip(dense_members, wires):
            self._handles[p] = (handle, wc)

    def synchronize(self):
        """Waits for every gradient's reduction and writes the results into p.grad. Gradients
        that no hook submitted (parameters unused in this step) are reduced now, as zeros where
        there is none, so every rank submits the same names. On a rank outside the optimizer's
        process set: nothing to do."""
        if not self._reducing:
            self._synchronized = True
            return
        for group in self.param_groups:
            for p in group["params"]:
                if p in self._requires_update and self._handles.get(p, (None,))[0] is None:
                    if p in self._p_to_group:
                        self._group_counts.setdefault(self._p_to_group[p], set()).discard(p)
                    self._submit(p)
        for p, (handle, ctx) in list(self._handles.items()):
            result = hora.synchronize(handle)
            if ctx is None:  # sparse_allreduce_async's result
                p.grad = result
                continue
            wire, cctx = ctx
            result = self._compression.decompress(wire, cctx)
            if p.grad.is_sparse:  # reduced as dense: sparse again for the wrapped optimizer
                p.grad = result.to_sparse(p.grad.sparse_dim())
            elif result is not p.grad:
                p.grad.copy_(result)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize again (call synchronize() first, e.g.
        to clip the reduced gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # the first words are Horovod's: scripts and tests filter warnings on them
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are reduced "
                              "a second time; step inside optimizer.skip_synchronize()")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, forgetting any reduction in progress (as Horovod's)."""
        self._handles = {}
        self._group_counts = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        return super(self.__class__, self).load_state_dict(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,  # noqa: N802
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """`optimizer`, averaging (or summing: op=Sum) every gradient over the ranks of
    `process_set` before each step; on a rank outside the set it reduces nothing. `num_groups`
    (or `groups` as a number) splits the parameters into that many groups, or `groups` (lists
    of parameters) names them: a group is reduced as one grouped allreduce once all its
    gradients are ready. Sparse gradients are gathered (sparse_allreduce_async), or reduced
    densely with sparse_as_dense=True. Like Horovod, the wrapped optimizer's state starts anew:
    broadcast_optimizer_state and broadcast_parameters from rank 0 after wrapping."""
    if op is Adasum:
        _op(None, op)  # raises: not provided
    if op not in (Average, Sum, hora.Min, hora.Max, hora.Product):
        raise ValueError("hora.torch.DistributedOptimizer: unknown op %r" % (op,))
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("hora.torch.DistributedOptimizer: gradient_predivide_factor needs "
                         "op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("hora.torch.DistributedOptimizer: backward_passes_per_step must be >= 1")
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError("hora.torch.DistributedOptimizer: groups must be a non-negative "
                             "number or lists of parameters")
        if num_groups and groups:
            raise ValueError("hora.torch.DistributedOptimizer: pass num_groups or groups, "
                             "not both")
        num_groups, groups = num_groups or groups, None
    if num_groups and groups:
        raise ValueError("hora.torch.DistributedOptimizer: pass num_groups or groups, not both")
    if num_groups:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        size = -(-len(params) // num_groups)
        groups = [params[i:i + size] for i in range(0, len(params), size)]
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
