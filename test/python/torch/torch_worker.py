# SPDX-License-Identifier: Apache-2.0
"""Rank program of test_torch.py: horovod.torch's API on hora.

Every rank knows what every rank submits (a function of its rank), so each computes the expected
results itself. The training checks compare against a model trained in this process alone on
the whole batch. Prints "torch checks passed: N" at the end; a failed check raises.
"""

import copy
import warnings

import torch

import hora
import hora.torch as hvd

checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError("rank %d: %s" % (hvd.rank(), what))
    checks += 1


def same(got, want, what, atol=0.0, rtol=0.0):
    want = torch.as_tensor(want)
    ok = got.shape == want.shape and torch.allclose(got.double(), want.double(), atol=atol,
                                                    rtol=rtol)
    check(ok, "%s: got %s, want %s" % (what, got, want))


def collectives(r, n):
    base = torch.arange(6.0).reshape(2, 3)
    every = [base + k for k in range(n)]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8):
        mine = (base + r).to(dtype)
        out = hvd.allreduce(mine, op=hvd.Sum, name="sum.%s" % dtype)
        check(out.dtype == dtype and out.device == mine.device, "dtype/device kept: %s" % dtype)
        same(out, sum(every), "Sum %s" % dtype)
        same(hvd.allreduce(mine, op=hvd.Min), base, "Min %s" % dtype)
        same(hvd.allreduce(mine, op=hvd.Max), base + n - 1, "Max %s" % dtype)
        small = (base % 2 + r + 1).to(dtype)
        prod = torch.ones_like(base)
        for k in range(n):
            prod = prod * (base % 2 + k + 1)
        same(hvd.allreduce(small, op=hvd.Product), prod, "Product %s" % dtype)
        if dtype.is_floating_point:
            same(hvd.allreduce(mine), sum(every) / n, "Average (default) %s" % dtype)
            same(hvd.allreduce(mine, average=False), sum(every), "average=False %s" % dtype)
            same(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0),
                 sum(every) * 2, "pre/postscale %s" % dtype)

    x = torch.full((4,), float(r + 1))
    check(hvd.allreduce_(x, op=hvd.Sum) is x, "allreduce_ returns its tensor")
    same(x, torch.full((4,), n * (n + 1) / 2), "allreduce_ in place")

    handles = [hvd.allreduce_async(torch.full((k + 1,), float(r)), op=hvd.Sum, name="a.%d" % k)
               for k in range(5)]
    for k, h in enumerate(handles):
        while not hvd.poll(h):
            pass
        same(hvd.synchronize(h), torch.full((k + 1,), float(sum(range(n)))), "async %d" % k)

    group = [torch.full((k + 2,), float(r + k)) for k in range(3)]
    outs = hvd.grouped_allreduce(group, op=hvd.Sum)
    for k, o in enumerate(outs):
        same(o, torch.full((k + 2,), float(sum(j + k for j in range(n)))), "grouped %d" % k)
    hvd.grouped_allreduce_(group, op=hvd.Max)
    for k, t in enumerate(group):
        same(t, torch.full((k + 2,), float(n - 1 + k)), "grouped_ %d" % k)
    halves = hvd.grouped_allreduce([torch.full((3,), float(r))], compression=hvd.Compression.fp16)
    same(halves[0], torch.full((3,), (n - 1) / 2), "grouped with fp16 compression")
    check(halves[0].dtype == torch.float32, "fp16 compression gives float32 back")

    rows = torch.full((r + 1, 2), float(r), dtype=torch.bfloat16)
    gathered = hvd.allgather(rows)
    check(gathered.dtype == torch.bfloat16, "allgather keeps bfloat16")
    same(gathered, torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)]), "allgather")
    # rank 0 sends no rows: torch exports an empty (0, 3) tensor with strides [1, 1]
    uneven = hvd.allgather(torch.full((r, 3), float(r)))
    same(uneven, torch.cat([torch.full((k, 3), float(k)) for k in range(n)]),
         "allgather with an empty (0, 3) tensor on rank 0")
    pair = hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r, r]])])
    same(pair[0], torch.arange(n), "grouped_allgather 0")
    same(pair[1], torch.arange(n).repeat_interleave(2).reshape(n, 2), "grouped_allgather 1")

    t = torch.arange(3.0) + 10 * r
    same(hvd.broadcast(t, root_rank=n - 1), torch.arange(3.0) + 10 * (n - 1), "broadcast")
    same(t, torch.arange(3.0) + 10 * r, "broadcast leaves its input")
    hvd.broadcast_(t, root_rank=0)
    same(t, torch.arange(3.0), "broadcast_")

    sends = torch.cat([torch.full((i + 1,), 100.0 * r + i) for i in range(n)])
    out, received = hvd.alltoall(sends, splits=[i + 1 for i in range(n)])
    same(out, torch.cat([torch.full((r + 1,), 100.0 * k + r) for k in range(n)]), "alltoall")
    same(received, torch.full((n,), r + 1), "alltoall received splits")
    check(received.dtype == torch.int64, "received splits are int64")
    same(hvd.alltoall(torch.arange(n) + 10 * r), torch.arange(n) * 10 + r, "alltoall even")

    data = torch.arange(float(2 * n)).reshape(n, 2) + r
    total = sum(torch.arange(float(2 * n)).reshape(n, 2) + k for k in range(n))
    same(hvd.reducescatter(data), total[r:r + 1] / n, "reducescatter Average (default)")
    same(hvd.reducescatter(data, op=hvd.Sum), total[r:r + 1], "reducescatter Sum")
    two = hvd.grouped_reducescatter([data, data * 2], op=hvd.Sum)
    same(two[1], total[r:r + 1] * 2, "grouped_reducescatter")

    hvd.barrier()
    check(hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=n - 1)
          == {"from": n - 1, "list": [1, 2]}, "broadcast_object")
    check(hvd.allgather_object(("rank", r) if r % 2 else "x" * (100 * r + 1))
          == [("rank", k) if k % 2 else "x" * (100 * k + 1) for k in range(n)],
          "allgather_object")


def autograd(r, n):
    x = torch.full((3,), float(r + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    same(x.grad, torch.full((3,), float(n)), "allreduce gradient: the sum of ones")

    w = torch.arange(float(sum(k + 1 for k in range(n)) * 2)).reshape(-1, 2)
    y = torch.full((r + 1, 2), 1.0, requires_grad=True)
    (hvd.allgather(y) * w).sum().backward()
    start = sum(k + 1 for k in range(r))
    same(y.grad, w[start:start + r + 1], "allgather gradient: this rank's rows, averaged")

    z = torch.full((2,), float(r), requires_grad=True)
    (hvd.broadcast(z, root_rank=0) * 3).sum().backward()
    same(z.grad, torch.full((2,), 3.0 if r == 0 else 0.0),
         "broadcast gradient at the root, averaged")


def errors(r, n):
    try:
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    except hora.UnsupportedError as e:
        check("Adasum" in str(e), "Adasum: named in the error")
    else:
        raise AssertionError("Adasum did not raise")
    if n > 1:
        try:
            hvd.allreduce(torch.ones(3 if r == 0 else 4), name="bad.shape")
        except hvd.HorovodInternalError as e:
            check(isinstance(e, hora.MismatchError) and "bad.shape" in str(e),
                  "mismatch: MismatchError naming the tensor, caught as HorovodInternalError")
        else:
            raise AssertionError("mismatched shapes did not raise")
        same(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)),
             "usable after a mismatch")
    same(hvd.allreduce(torch.full((2,), r, dtype=torch.int32)),
         torch.full((2,), (n * (n - 1) // 2) // n, dtype=torch.int32),
         "Average on int32, truncated (test_semantics.py checks it thoroughly)")
    # splits must be integers: a float tensor is refused on every rank, not truncated
    try:
        hvd.alltoall(torch.ones(n), torch.full((n,), 1e30))
    except ValueError as e:
        check("splits" in str(e), "alltoall float splits: the error names them")
    else:
        raise AssertionError("alltoall with float splits did not raise")
    same(hvd.alltoall(torch.full((n,), float(r)), torch.ones(n, dtype=torch.int16))[0],
         torch.arange(n, dtype=torch.float32), "alltoall with int16 splits")


def process_sets(r, n):
    if n < 3:
        return
    ps = hvd.add_process_set([0, n - 1])
    if ps.included():
        same(hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=ps),
             torch.tensor([float(n - 1)]), "allreduce on a process set")
        same(hvd.allgather(torch.tensor([r]), process_set=ps), torch.tensor([0, n - 1]),
             "allgather on a process set")
    check(hvd.remove_process_set(ps), "remove_process_set")


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3),
                               torch.nn.Linear(3, 1)).double()


def batches(steps, total, seed=7):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(total, 5, generator=gen, dtype=torch.float64)
        yield x, (x.sum(dim=1, keepdim=True) > 0).double()


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def training(r, n, make_opt, steps=8, batch=6, passes=1, atol=1e-12, label="", **kwargs):
    """n ranks with `batch` rows each against one model trained here on all n*batch rows."""
    net = model(seed=100 + r)  # different everywhere until the broadcast
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    reference = copy.deepcopy(net)
    ref_opt = make_opt(reference.parameters())
    opt = hvd.DistributedOptimizer(make_opt(net.parameters()),
                                   named_parameters=net.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step, (x, y) in enumerate(batches(steps, n * batch)):
        mine = slice(r * batch, (r + 1) * batch)
        opt.zero_grad()
        for part in range(passes):  # gradients accumulated over `passes` backward passes
            rows = slice(mine.start + part * batch // passes, mine.start + (part + 1) * batch // passes)
            (loss_fn(net(x[rows]), y[rows]) / passes).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(reference(x), y).backward()
        ref_opt.step()
        params = flat(net)
        gathered = hvd.allgather(params.unsqueeze(0), name="params.%s.%d" % (label, step))
        check(all(torch.equal(g, params) for g in gathered),
              "%s step %d: parameters identical on every rank" % (label, step))
        same(params, flat(reference), "%s step %d: %d ranks x %d rows = 1 rank x %d rows"
             % (label, step, n, batch, n * batch), atol=atol, rtol=atol)


def optimizer_state(r, n):
    net = model(seed=1)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, betas=(0.8 + 0.01 * r, 0.99))
    if r == 0:  # only the root has stepped: the others' state is empty
        net(torch.ones(2, 5, dtype=torch.float64)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    check(abs(state["param_groups"][0]["betas"][0] - 0.8) < 1e-12, "param_groups options")
    check(len(state["state"]) == 6, "every parameter has the root's state")
    for key, s in sorted(state["state"].items()):
        for name in ("exp_avg", "exp_avg_sq", "step"):
            t = s[name] if isinstance(s[name], torch.Tensor) else torch.tensor(s[name])
            gathered = hvd.allgather(t.reshape(1, -1).double(), name="state.%s.%s" % (key, name))
            check(all(torch.equal(g, gathered[0]) for g in gathered),
                  "optimizer state %s of %s the same everywhere" % (name, key))


def unused_parameter(r, n):
    """A parameter no rank uses this step still gets a (zero) reduced gradient."""
    net = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 1), "unused": torch.nn.Linear(2, 1)})
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters())
    opt.zero_grad()
    net["used"](torch.full((1, 2), float(r))).sum().backward()
    opt.step()
    if n > 1:  # (alone, the optimizer leaves gradients to torch, as Horovod's does)
        same(net["unused"].weight.grad, torch.zeros(1, 2), "the unused parameter's gradient is zero")
    same(net["used"].weight.grad, torch.full((1, 2), (n - 1) / 2), "the used one is averaged")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        opt.zero_grad()


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    check(hvd.is_initialized() and hvd.local_size() == n and hvd.cross_size() == 1,
          "topology")
    collectives(r, n)
    autograd(r, n)
    errors(r, n)
    process_sets(r, n)
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    adam = lambda p: torch.optim.Adam(p, lr=0.01)  # noqa: E731
    training(r, n, sgd, label="sgd")
    training(r, n, adam, label="adam", atol=1e-10)
    training(r, n, sgd, passes=2, label="two passes")
    training(r, n, sgd, num_groups=2, label="groups")
    training(r, n, sgd, label="fp16", compression=hvd.Compression.fp16, atol=2e-3)
    optimizer_state(r, n)
    unused_parameter(r, n)
    last = hvd.join()
    check(0 <= last < n, "join returns a rank")
    hvd.shutdown()
    print("rank %d of %d: torch checks passed: %d" % (r, n, checks), flush=True)


if __name__ == "__main__":
    main()
