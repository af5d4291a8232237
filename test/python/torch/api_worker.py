# SPDX-License-Identifier: Apache-2.0
"""Rank program of test_api.py: the parts of horovod.torch's API that hora.torch added to match
it (sparse allreduce and sparse gradients, SyncBatchNorm, broadcast_optimizer_state's gradients,
DuplicateNameError, the optimizer's _parameter_names and process-set skip).

Every rank regenerates every rank's inputs from seeds, so each computes the expected results
alone (references: torch on one process over the concatenation of every rank's data). Each item
prints "api <item>: ok (rank R of N)"; the first failed check raises, which ends the job.
"""

import copy
import sys

import torch

import hora
import hora.torch as hvd


def check(condition, what):
    if not condition:
        raise AssertionError("rank %d: %s" % (hvd.rank(), what))


def close(got, want, what, tol=1e-9):
    want = torch.as_tensor(want)
    ok = (tuple(got.shape) == tuple(want.shape)
          and torch.allclose(got.double(), want.double(), atol=tol, rtol=tol))
    check(ok, "%s: got %s, want %s" % (what, got, want))


def done(item):
    print("api %s: ok (rank %d of %d)" % (item, hvd.rank(), hvd.size()), flush=True)


# --- sparse ---------------------------------------------------------------------------------

def random_sparse(rank, shape, dense_dims=0, dtype=torch.float64, density=0.3):
    """Rank `rank`'s sparse tensor: a few entries (none for rank 1 of the empty case)."""
    gen = torch.Generator().manual_seed(1000 + rank)
    dense = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = torch.rand(shape[:len(shape) - dense_dims], generator=gen) < density
    dense = dense * mask.reshape(mask.shape + (1,) * dense_dims)
    return dense.to(dtype).to_sparse(len(shape) - dense_dims)


def sparse(r, n):
    cases = [((7, 5), 0, torch.float64), ((9, 4), 1, torch.float32), ((6, 3), 1, torch.int64)]
    for i, (shape, dense_dims, dtype) in enumerate(cases):
        mine = random_sparse(r, shape, dense_dims, dtype)
        every = [random_sparse(k, shape, dense_dims, dtype).to_dense() for k in range(n)]
        for op in (hvd.Sum, hvd.Average):
            handle = hvd.sparse_allreduce_async(mine, name="sparse.%d.%d" % (i, op), op=op)
            while not hvd.poll(handle):
                pass
            out = hvd.synchronize(handle)
            check(out.is_sparse and out.dtype == dtype and out.shape == mine.shape
                  and out.sparse_dim() == mine.sparse_dim(), "sparse result %d: %s" % (i, out))
            want = sum(every)
            if op == hvd.Average:
                # integers: truncated toward zero, as hora.torch's dense integer Average
                want = want / n if dtype.is_floating_point else torch.trunc(want.double() / n).to(dtype)
            close(out.to_dense(), want, "sparse_allreduce_async %d op %d" % (i, op), tol=1e-6)
    # Horovod's handles are called; a rank with no entries; the name may be omitted
    empty = torch.zeros(4, 2).to_sparse() if r == 1 else torch.eye(4, 2).to_sparse()
    out = hvd.sparse_allreduce_async(empty, None, hvd.Sum)()
    close(out.to_dense(), torch.eye(4, 2) * (n - 1 if n > 1 else 1), "sparse, one rank empty")

    # DistributedOptimizer: sparse gradients gathered, or reduced densely; sparse either way
    lookups = [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]), torch.tensor([[1, 3, 4], [4, 7, 9]])]
    for as_dense in (False, True):
        torch.manual_seed(5)
        emb = torch.nn.Embedding(10, 3, sparse=True).double()
        start = emb.weight.detach().clone()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=as_dense)
        opt.zero_grad()
        emb(lookups[r % 2]).sum().backward()
        opt.synchronize()
        check(emb.weight.grad.is_sparse, "sparse_as_dense=%s: the gradient stays sparse" % as_dense)
        counts = torch.zeros(10, dtype=torch.float64)
        for k in range(n):
            counts.index_add_(0, lookups[k % 2].reshape(-1), torch.ones(lookups[k % 2].numel(),
                                                                          dtype=torch.float64))
        grad = (counts / n).unsqueeze(1).expand(10, 3)
        close(emb.weight.grad.to_dense(), grad, "sparse_as_dense=%s: averaged gradient" % as_dense)
        with opt.skip_synchronize():
            opt.step()
        close(emb.weight.detach(), start - 0.5 * grad, "sparse_as_dense=%s: SGD step" % as_dense)
        # SparseAdam takes only sparse gradients (Horovod's test_sparse_embeddings)
        # (a new module: a second optimizer on the same parameters would add its hooks to the
        # first one's, in Horovod as here)
        emb2 = copy.deepcopy(emb)
        adam = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb2.parameters()), lr=0.1),
                                        named_parameters=emb2.named_parameters(),
                                        sparse_as_dense=as_dense)
        adam.zero_grad()
        emb2(lookups[r % 2]).sum().backward()
        adam.step()
        gathered = hvd.allgather(emb2.weight.detach().unsqueeze(0), name="emb.%s" % as_dense)
        check(all(torch.equal(g, gathered[0]) for g in gathered),
              "sparse_as_dense=%s: SparseAdam leaves the same weights everywhere" % as_dense)
    done("sparse")


# --- SyncBatchNorm --------------------------------------------------------------------------

def batch(rank, rows, shape, seed):
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn((rows,) + shape, generator=gen, dtype=torch.float64) * (rank + 1) + rank


def sync_batch_norm(r, n):
    rows = [k + 2 for k in range(n)]  # different batch sizes
    shape = (3, 4, 2)
    # two steps with momentum (changed in between), two of cumulative averaging (None)
    for step, (momentum, fresh) in enumerate([(0.1, True), (0.3, False), (None, True),
                                              (None, False)]):
        if fresh:
            sync = hvd.SyncBatchNorm(3, momentum=momentum).double()
            ref = torch.nn.BatchNorm2d(3, momentum=momentum).double()
            with torch.no_grad():
                sync.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
                sync.bias.copy_(torch.tensor([0.0, 0.5, 1.0]))
            ref.load_state_dict(sync.state_dict())
        sync.momentum = ref.momentum = momentum
        xs = [batch(k, rows[k], shape, step) for k in range(n)]
        gs = [batch(k, rows[k], shape, step + 50) for k in range(n)]  # d loss / d output
        x = xs[r].clone().requires_grad_()
        out = sync(x)
        (out * gs[r]).sum().backward()
        x_all = torch.cat(xs).requires_grad_()
        out_all = ref(x_all)
        (out_all * torch.cat(gs)).sum().backward()
        at = sum(rows[:r])
        what = "SyncBatchNorm step %d (momentum %s)" % (step, momentum)
        close(out, out_all[at:at + rows[r]].detach(), what + ": output")
        close(x.grad, x_all.grad[at:at + rows[r]], what + ": input gradient")
        close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), ref.weight.grad,
              what + ": weight gradient summed over ranks")
        close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), ref.bias.grad,
              what + ": bias gradient summed over ranks")
        close(sync.running_mean, ref.running_mean, what + ": running_mean")
        close(sync.running_var, ref.running_var, what + ": running_var (unbiased)")
        check(int(sync.num_batches_tracked) == int(ref.num_batches_tracked),
              what + ": num_batches_tracked")
        sync.zero_grad()
        ref.zero_grad()
    sync.eval()
    ref.eval()
    x = batch(r, 3, shape, 99)
    close(sync(x), ref(x), "SyncBatchNorm eval: running statistics")

    # a rank with an empty batch; float32; 3D input; no affine parameters
    sync = hvd.SyncBatchNorm(2, affine=False)
    ref = torch.nn.BatchNorm1d(2, affine=False)
    xs = [batch(k, 0 if k == 0 else 3 * k, (2, 5), 7).float() for k in range(n)]
    x = xs[r].clone().requires_grad_()
    out = sync(x)
    out.pow(2).sum().backward()
    x_all = torch.cat(xs).requires_grad_()
    out_all = ref(x_all)
    out_all.pow(2).sum().backward()
    at = sum(x.shape[0] for x in xs[:r])
    close(out, out_all[at:at + xs[r].shape[0]].detach(), "SyncBatchNorm float32, empty rank",
          tol=1e-5)
    close(x.grad, x_all.grad[at:at + xs[r].shape[0]], "SyncBatchNorm float32 input gradient",
          tol=1e-4)
    close(sync.running_var, ref.running_var, "SyncBatchNorm float32 running_var", tol=1e-5)
    done("sync_batch_norm")


# --- broadcast_optimizer_state: gradients ------------------------------------------------

class NoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.index = torch.nn.Parameter(torch.tensor([1, 3]), requires_grad=False)
        self.b = torch.nn.Parameter(torch.rand(4))
        self.c = torch.nn.Parameter(torch.rand(2))

    def forward(self, x):
        return torch.index_select(self.b, 0, self.index) * x + self.c


def optimizer_state_grads(r, n):
    model = NoGrad()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True),
        named_parameters=model.named_parameters())
    model.c.grad = torch.full((2,), 7.0)  # a gradient already there is kept
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(model.index.grad is None, "no .grad for a parameter that does not require one")
    check(isinstance(model.b.grad, torch.Tensor) and torch.equal(model.b.grad, torch.zeros(4)),
          "broadcast_optimizer_state: .grad zeros where it was None (got %s)" % model.b.grad)
    check(torch.equal(model.c.grad, torch.full((2,), 7.0)), "an existing .grad is kept")
    check(len(opt.state_dict()["state"]) == 2,
          "the state is initialized, as Horovod's (%d entries)" % len(opt.state_dict()["state"]))
    check(opt._handles == {}, "no reduction left in flight")  # pylint: disable=protected-access

    # Adam: the zero step initializes the state (step 1, zero moments) on every rank
    torch.manual_seed(3)
    net = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in net.parameters()]
    adam = torch.optim.Adam(net.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(adam, 0)
    for p, b in zip(net.parameters(), before):
        state = adam.state[p]
        check(int(state["step"]) == 1 and torch.count_nonzero(state["exp_avg"]) == 0,
              "Adam's state after broadcast_optimizer_state: %s" % state)
        check(torch.equal(p.detach(), b) and torch.equal(p.grad, torch.zeros_like(p)),
              "a zero step leaves the parameters; .grad zeros")

    # SparseAdam (and SGD on sparse embeddings of `model`): sparse zero gradients
    emb = torch.nn.Embedding(5, 2, sparse=True)
    sparse_adam = torch.optim.SparseAdam(list(emb.parameters()))
    hvd.broadcast_optimizer_state(sparse_adam, root_rank=0)
    check(emb.weight.grad is not None and emb.weight.grad.is_sparse,
          "SparseAdam: a sparse zero gradient")
    emb2 = torch.nn.Embedding(5, 2, sparse=True)
    hvd.broadcast_optimizer_state(torch.optim.SGD(emb2.parameters(), lr=0.1), 0, emb2)
    check(emb2.weight.grad is not None and emb2.weight.grad.is_sparse,
          "SGD with model=: the sparse embedding's zero gradient is sparse")
    done("optimizer_state_grads")


# --- DuplicateNameError -------------------------------------------------------------------

def duplicate_name(r, n):
    first = hvd.allreduce_async(torch.ones(3), name="dup.name", op=hvd.Sum)
    try:
        hvd.allreduce_async(torch.ones(3), name="dup.name", op=hvd.Sum)
    except ValueError as e:  # Horovod scripts catch it as a ValueError
        check(isinstance(e, hora.DuplicateNameError) and "dup.name" in str(e),
              "DuplicateNameError naming the tensor: %r" % e)
    else:
        raise AssertionError("a second op of an in-flight name did not raise")
    close(hvd.synchronize(first), torch.full((3,), float(n)), "the first op completes")
    done("duplicate_name")


# --- DistributedOptimizer: _parameter_names, process set -------------------------------

def parameter_names_and_sets(r, n):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    names = opt._parameter_names  # pylint: disable=protected-access
    check(names == {p: k for k, p in model.named_parameters()},
          "_parameter_names maps each parameter to its name: %s" % names)
    check(opt._requires_update == set(model.parameters())  # pylint: disable=protected-access
          and opt.backward_passes_per_step == 1, "_requires_update, backward_passes_per_step")
    groups = torch.optim.SGD([{"params": model[0].parameters()},
                              {"params": model[1].parameters(), "lr": 0.2}], lr=0.1)
    unnamed = hvd.DistributedOptimizer(groups)._parameter_names  # pylint: disable=protected-access
    values = sorted(unnamed.values())
    check(len(set(values)) == 4 and set(unnamed) == set(model.parameters()),
          "_parameter_names without named_parameters: unique names %s" % values)
    every = hvd.allgather_object(values, name="names")
    check(all(v == values for v in every), "the same names on every rank")

    # process_set: a rank outside the set skips every reduction
    inside = hvd.add_process_set([0])
    torch.manual_seed(11)
    net = torch.nn.Linear(3, 1).double()
    start = [p.detach().clone() for p in net.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5),
                                   named_parameters=net.named_parameters(), process_set=inside)
    x = torch.full((2, 3), float(r + 1), dtype=torch.float64)
    for step in range(2):
        opt.zero_grad()
        net(x).sum().backward()
        local = [p.grad.detach().clone() for p in net.parameters()]
        opt.step()  # on the set of one, the average is the rank's own gradient
        for p, s, g in zip(net.parameters(), start, local):
            close(p.detach(), s - 0.5 * g, "process_set step %d (rank %s the set)"
                  % (step, "in" if r == 0 else "outside"))
            s.copy_(p.detach())
    if r != 0:
        # pylint: disable-next=protected-access
        check(opt._requires_update == set() and opt._handles == {},
              "outside the set: no hooks, nothing in flight")
    hvd.barrier()
    hvd.remove_process_set(inside)
    done("parameter_names_and_sets")


ITEMS = [duplicate_name, sparse, sync_batch_norm, optimizer_state_grads, parameter_names_and_sets]


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    wanted = set(sys.argv[1:])
    for item in ITEMS:
        if not wanted or item.__name__ in wanted:
            item(r, n)
    hvd.shutdown()
    print("rank %d of %d: api checks done" % (r, n), flush=True)


if __name__ == "__main__":
    main()
