# SPDX-License-Identifier: Apache-2.0
"""DistributedOptimizer: wraps a torch optimizer so that every gradient is averaged over the ranks
while backpropagation is still producing the others, as horovod.torch's does.

A hook on each parameter's gradient accumulator submits the gradient to hora the moment it is
accumulated (after `backward_passes_per_step` passes); hora fuses what is ready into large
buffers. step() (or synchronize()) waits for the reductions and then applies the update.
"""

import contextlib
import warnings

import torch

import hora
from hora import global_process_set

from .compression import Compression
from .mpi_ops import Adasum, Average, Sum, _op

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer(torch.optim.Optimizer):
    # The methods of this class are grafted onto a subclass of the wrapped optimizer's class, so
    # that isinstance() and the optimizer's own step() keep working.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._passes = backward_passes_per_step

        params_in_groups = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("noname.%d" % i, p) for i, p in enumerate(params_in_groups)]
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
        self._names = {id(p): "allreduce." + n for n, p in named_parameters}

        # groups: lists of parameters reduced as one grouped allreduce once all are ready
        self._group_of = {}
        self._groups = []
        if groups:
            for g in groups:
                members = [p for p in g if p.requires_grad]
                index = len(self._groups)
                self._groups.append(members)
                for p in members:
                    self._group_of[id(p)] = index
        self._ready = {}  # group index -> set of ids whose gradient is ready

        self._handles = {}  # id(param) -> (param, handle, compression context) or group key
        self._delay = {}
        self._hooks = []
        self._grad_accs = []  # keeps the accumulators (and so the hooks) alive
        self._synchronized = False
        self._should_synchronize = True
        self._size = (process_set.size() if isinstance(process_set, hora.ProcessSet)
                      and process_set.process_set_id not in (None, 0) else hora.size())
        if self._size > 1 or hora.size() > 1:
            self._register_hooks()

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._delay[id(p)] = self._passes
                # the accumulator node that writes p.grad: its hook runs once p.grad is final
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*_):
            if id(p) in self._handles and self._handles[id(p)][1] is not None:
                if self._delay[id(p)] <= 0:
                    raise AssertionError(
                        "hora.torch: gradients were computed more than backward_passes_per_step "
                        "times before step() or synchronize(); raise backward_passes_per_step "
                        "to accumulate them")
            self._delay[id(p)] -= 1
            if self._delay[id(p)] == 0:
                self._submit(p)
        return hook

    def _scales(self):
        """(op for hora, prescale, postscale): Average divides by gradient_predivide_factor
        before the sum and by size / gradient_predivide_factor after."""
        if self._op == Average:
            return Sum, 1.0 / self._predivide, self._predivide / self._size
        return self._op, 1.0, 1.0

    def _grad(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            if not self._sparse_as_dense:
                raise ValueError("hora.torch: sparse gradients are reduced dense: pass "
                                 "sparse_as_dense=True")
            p.grad = p.grad.to_dense()
        return p.grad

    def _submit(self, p):
        if id(p) in self._group_of:
            index = self._group_of[id(p)]
            ready = self._ready.setdefault(index, set())
            ready.add(id(p))
            if len(ready) < len(self._groups[index]):
                self._handles[id(p)] = (p, None, None)  # waits for its group
                return
            self._submit_group(index)
            return
        op, pre, post = self._scales()
        wire, ctx = self._compression.compress(self._grad(p))
        handle = hora.allreduce_async_(wire, op, pre, post, self._names[id(p)], self._process_set)
        self._handles[id(p)] = (p, handle, (wire, ctx))

    def _submit_group(self, index):
        members = self._groups[index]
        op, pre, post = self._scales()
        wires = [self._compression.compress(self._grad(p)) for p in members]
        handle = hora.grouped_allreduce_async_(
            [w for w, _ in wires], op, pre, post,
            "grouped." + self._names[id(members[0])], self._process_set)
        for p, wc in zip(members, wires):
            self._handles[id(p)] = (p, handle, wc)
        self._ready[index] = set()

    def synchronize(self):
        """Waits for every gradient's reduction and writes the results into p.grad. Gradients
        that no hook submitted (parameters unused in this step) are reduced now, as zeros where
        there is none, so every rank submits the same names."""
        if self._size > 1 or hora.size() > 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad and (id(p) not in self._handles
                                            or self._handles[id(p)][1] is None):
                        if id(p) in self._group_of:
                            self._ready.setdefault(self._group_of[id(p)], set()).discard(id(p))
                        self._submit(p)
            for p, handle, (wire, ctx) in list(self._handles.values()):
                handle.wait()
                result = self._compression.decompress(wire, ctx)
                if result is not p.grad:
                    p.grad.copy_(result)
            for key in self._delay:
                self._delay[key] = self._passes
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
                warnings.warn("optimizer.step() after optimizer.synchronize() outside "
                              "optimizer.skip_synchronize(): the gradients are reduced twice")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,  # noqa: N802
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """`optimizer`, averaging (or summing: op=Sum) every gradient over the ranks of
    `process_set` before each step. `num_groups` splits the parameters into that many groups,
    or `groups` (lists of parameters) names them: a group is reduced as one grouped allreduce
    once all its gradients are ready. Like Horovod, the wrapped optimizer's state starts anew:
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
