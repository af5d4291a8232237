# SPDX-License-Identifier: Apache-2.0
"""Rank program of test_semantics.py: one group of checks of hora.torch against Horovod's
semantics, named on the command line (dtypes, integers, autograd, sets, reject, grouped).

Every rank knows what every rank submits (a function of its rank), so each computes the expected
results itself, without hora: integer scaling with Python's math.trunc (as Horovod), float16 with
numpy, bfloat16 by rounding float32 bits, gradients by running the same function on every rank's
input in this one process under torch's autograd. Prints "rank R of N: CHECK passed: K".
"""

import math
import contextlib
import inspect
import os
import sys
import time

import numpy as np
import torch

import hora
import hora.torch as hvd

checks = 0
TIME_SCALE = max(1.0, float(os.environ.get("HORA_TEST_TIME_SCALE") or 1))


KEEP_GOING = os.environ.get("HORA_TEST_KEEP_GOING") == "1"  # by hand: list every failure


def check(condition, what):
    global checks
    if not condition:
        if not KEEP_GOING:
            raise AssertionError("rank %d: %s" % (hvd.rank(), what))
        print("rank %d: FAILED: %s" % (hvd.rank(), what), flush=True)
    checks += 1


@contextlib.contextmanager
def section(what):
    """A part of a check whose error, with HORA_TEST_KEEP_GOING=1, is printed and passed
    over (every rank runs the same parts, so they stay in step)."""
    try:
        yield
    except Exception as error:  # pylint: disable=broad-except
        if not KEEP_GOING:
            raise
        print("rank %d: FAILED: %s: %s: %s" % (hvd.rank(), what, type(error).__name__, error),
              flush=True)


def same(got, want, what):
    """Exactly equal, with the dtype and shape wanted."""
    want = torch.as_tensor(want)
    ok = (isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
          and torch.equal(got, want))
    check(ok, "%s: got %r, want %r" % (what, got, want))


def close(got, want, what, tol=1e-12):
    ok = got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=tol,
                                                     atol=tol)
    check(ok, "%s: got %s, want %s" % (what, got, want))


def raises(kinds, fn, what, needles=()):
    """fn() raises one of `kinds`, whose message holds every needle; returns the error."""
    try:
        fn()
    except kinds as error:
        text = str(error)
        check(all(n in text for n in needles), "%s: %r lacks %s" % (what, text, needles))
        return error
    raise AssertionError("rank %d: %s did not raise %s" % (hvd.rank(), what, kinds))


# --- independent arithmetic ---------------------------------------------------------------------

def int_scaled(values, factor, dtype):
    """Python's exact arithmetic: values * factor truncated toward zero (as Horovod's C++
    conversion does), saturated to dtype."""
    info = torch.iinfo(dtype)
    out = [min(max(math.trunc(v * factor), info.min), info.max) for v in values]
    return torch.tensor(out, dtype=dtype)


def half_rounded(values_f32):
    """float32 values rounded to float16 by numpy (correct rounding, not torch's)."""
    return torch.from_numpy(np.asarray(values_f32, dtype=np.float32).astype(np.float16))


def bf16_rounded(values_f32):
    """float32 values rounded to bfloat16 (to nearest, ties to even) on their bits."""
    bits = np.asarray(values_f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return torch.from_numpy(bits.astype(np.uint32).view(np.float32)).to(torch.bfloat16)


# --- 1. dtypes ----------------------------------------------------------------------------------

def dtypes(r, n):
    """int16 through every collective (values past int8's range), bool where Horovod takes it
    (allgather, grouped_allgather, broadcast, alltoall)."""
    i16 = torch.int16
    mine = torch.tensor([1000 + r, -2000 * (r + 1), 7 * r], dtype=i16)
    every = [torch.tensor([1000 + k, -2000 * (k + 1), 7 * k]) for k in range(n)]
    total = sum(every)
    same(hvd.allreduce(mine, op=hvd.Sum), total.to(i16), "int16 Sum")
    same(hvd.allreduce(mine, op=hvd.Min), torch.stack(every).min(0).values.to(i16), "int16 Min")
    same(hvd.allreduce(mine, op=hvd.Max), torch.stack(every).max(0).values.to(i16), "int16 Max")
    same(hvd.allreduce(torch.tensor([r + 2, -3], dtype=i16), op=hvd.Product),
         torch.tensor([int(np.prod([k + 2 for k in range(n)])), (-3) ** n], dtype=i16),
         "int16 Product")
    same(hvd.allreduce(mine), int_scaled(total.tolist(), 1.0 / n, i16), "int16 Average")
    inplace = mine.clone()
    check(hvd.allreduce_(inplace, op=hvd.Sum) is inplace, "int16 allreduce_ returns its tensor")
    same(inplace, total.to(i16), "int16 allreduce_")
    same(hvd.synchronize(hvd.allreduce_async(mine, op=hvd.Sum)), total.to(i16),
         "int16 allreduce_async")
    outs = hvd.grouped_allreduce([mine, mine * 2], op=hvd.Sum)
    same(outs[1], (total * 2).to(i16), "int16 grouped_allreduce")
    rows = torch.full((r + 1, 2), 300 * (r + 1), dtype=i16)
    gathered = torch.cat([torch.full((k + 1, 2), 300 * (k + 1)) for k in range(n)]).to(i16)
    same(hvd.allgather(rows), gathered, "int16 allgather")
    same(hvd.grouped_allgather([rows, rows[:1]])[1],
         torch.stack([torch.full((2,), 300 * (k + 1)) for k in range(n)]).to(i16),
         "int16 grouped_allgather")
    root = n - 1
    same(hvd.broadcast(mine, root_rank=root), every[root].to(i16), "int16 broadcast")
    target = mine.clone()
    hvd.broadcast_(target, root_rank=root)
    same(target, every[root].to(i16), "int16 broadcast_")
    sends = torch.tensor([1000 * r + k for k in range(n)], dtype=i16)
    same(hvd.alltoall(sends), torch.tensor([1000 * k + r for k in range(n)], dtype=i16),
         "int16 alltoall")
    block = torch.arange(2 * n, dtype=i16).reshape(n, 2) * 500 + r
    block_sum = sum(torch.arange(2 * n).reshape(n, 2) * 500 + k for k in range(n))
    same(hvd.reducescatter(block, op=hvd.Sum), block_sum[r:r + 1].to(i16), "int16 reducescatter")
    same(hvd.reducescatter(block), int_scaled(block_sum[r].tolist(), 1.0 / n, i16).reshape(1, 2),
         "int16 reducescatter Average")
    same(hvd.grouped_reducescatter([block, block], op=hvd.Sum)[1], block_sum[r:r + 1].to(i16),
         "int16 grouped_reducescatter")

    flags = torch.tensor([r % 2 == 0, True, False, r == n - 1])
    every_flags = [torch.tensor([k % 2 == 0, True, False, k == n - 1]) for k in range(n)]
    same(hvd.allgather(flags), torch.cat(every_flags), "bool allgather")
    same(hvd.grouped_allgather([flags, flags[:1]])[1], torch.stack([f[:1] for f in every_flags])
         .reshape(-1), "bool grouped_allgather")
    same(hvd.broadcast(flags, root_rank=root), every_flags[root], "bool broadcast")
    target = flags.clone()
    hvd.broadcast_(target, root_rank=root)
    same(target, every_flags[root], "bool broadcast_")
    bits = torch.tensor([(r + k) % 2 == 1 for k in range(n)])
    same(hvd.alltoall(bits), torch.tensor([(k + r) % 2 == 1 for k in range(n)]), "bool alltoall")
    # beyond Horovod, as hora's core reduces bool: Sum and Max are OR, Min and Product AND
    same(hvd.allreduce(flags, op=hvd.Sum), torch.stack(every_flags).any(0), "bool Sum (or)")
    same(hvd.allreduce(flags, op=hvd.Min), torch.stack(every_flags).all(0), "bool Min (and)")
    raises(hora.UnsupportedError, lambda: hvd.allreduce(flags), "bool Average", ("bool",))


# --- 2. integers, and reducescatter's scale factors ---------------------------------------------

def ints_of(k):
    """Rank k's integers: at 2 ranks they sum to 1, 3, 5, -1, -3, 4."""
    return [a + b * k for a, b in zip([0, 1, 2, 0, -1, 2], [1, 1, 1, -1, -1, 0])]


def rows_ints(k):
    """Rank k's 4x2 integers: at 2 ranks they sum to [[1, 3], [5, -1], [-3, 4], [6, 7]]."""
    return [[a + b * k for a, b in zip(row, step)]
            for row, step in zip([[0, 1], [2, 0], [-1, 2], [3, 3]],
                                 [[1, 1], [1, -1], [-1, 0], [0, 1]])]

def integers(r, n):
    """Average and scale factors on integers: hora sums, hora.torch scales in float64, truncating
    toward zero, saturating. float16/bfloat16 reducescatter factors rounded once."""
    assert n == 2
    # sums 1, 3, 5, -1, -3, 4: halves 0.5, 1.5, 2.5, -0.5, -1.5 truncate toward zero
    mine = torch.tensor(ints_of(r))
    total = [1, 3, 5, -1, -3, 4]
    with section("allreduce on integers"):
        for dtype in (torch.int32, torch.int64):
            x = mine.to(dtype)
            want = int_scaled(total, 0.5, dtype)
            same(hvd.allreduce(x), want, "%s Average (the default op)" % dtype)
            same(hvd.allreduce(x, average=True), want, "%s average=True" % dtype)
            y = x.clone()
            check(hvd.allreduce_(y, op=hvd.Average) is y, "allreduce_ returns its tensor")
            same(y, want, "%s allreduce_ Average" % dtype)
            same(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Average)), want,
                 "%s allreduce_async Average" % dtype)
            z = x.clone()
            handle = hvd.allreduce_async_(z, op=hvd.Average)
            check(hvd.synchronize(handle) is z, "allreduce_async_ gives its tensor")
            same(z, want, "%s allreduce_async_ Average" % dtype)
        count = hvd.allreduce(torch.tensor(5 + 2 * r))  # Horovod scripts average counters
        same(count, torch.tensor(6), "0-d int64 Average")

    # prescale applies to each rank's input before the sum: 3 * 0.5 = 1.5 -> 1 on each rank
    with section("integer scale factors"):
        three = torch.full((2,), 3, dtype=torch.int32)
        same(hvd.allreduce(three, op=hvd.Sum, prescale_factor=0.5),
             torch.full((2,), 2, dtype=torch.int32), "prescale truncates each rank's input")
        same(hvd.allreduce(three, op=hvd.Sum, postscale_factor=0.5),
             torch.full((2,), 3, dtype=torch.int32), "postscale scales the sum (6 * 0.5)")
        same(hvd.allreduce(three, op=hvd.Average, prescale_factor=3.0, postscale_factor=1.0 / 3),
             int_scaled([18], 1.0 / 6, torch.int32).expand(2), "Average with both factors")
        # saturation, both ends
        i8 = torch.tensor([60, -60, 3, 0], dtype=torch.int8)
        same(hvd.allreduce(i8, op=hvd.Sum, postscale_factor=3.0),
             int_scaled([120, -120, 6, 0], 3.0, torch.int8), "int8 postscale saturates")
        u8 = torch.tensor([2, 3, 100], dtype=torch.uint8) + r
        same(hvd.allreduce(u8, op=hvd.Sum, postscale_factor=-1.0),
             torch.zeros(3, dtype=torch.uint8), "uint8 saturates at 0")
        same(hvd.allreduce(u8), int_scaled([5, 7, 201], 0.5, torch.uint8), "uint8 Average")
        big = torch.tensor([2 ** 61, -2 ** 61, 5], dtype=torch.int64)
        same(hvd.allreduce(big, op=hvd.Sum, postscale_factor=4.0),
             torch.tensor([2 ** 63 - 1, -2 ** 63, 40], dtype=torch.int64), "int64 saturates")

    # grouped (a group shares one dtype): each member rounded on its own
    with section("grouped allreduce on integers"):
        members = [mine.to(torch.int32), (mine * 3).to(torch.int32)]
        outs = hvd.grouped_allreduce(members)
        same(outs[0], int_scaled(total, 0.5, torch.int32), "grouped int Average")
        same(outs[1], int_scaled([3 * v for v in total], 0.5, torch.int32), "grouped int Average 1")
        copies = [m.clone() for m in members]
        check(hvd.grouped_allreduce_(copies, op=hvd.Sum, postscale_factor=0.5)[1] is copies[1],
              "grouped_allreduce_ returns its tensors")
        same(copies[0], int_scaled(total, 0.5, torch.int32), "grouped_allreduce_ int postscale")
        same(copies[1], int_scaled([3 * v for v in total], 0.5, torch.int32),
             "grouped_allreduce_ 1")
        outs = hvd.synchronize(hvd.grouped_allreduce_async([members[0]], op=hvd.Average))
        same(outs[0], int_scaled(total, 0.5, torch.int32), "grouped_allreduce_async int")
        copies = [members[0].clone()]
        hvd.synchronize(hvd.grouped_allreduce_async_(copies, prescale_factor=0.5, op=hvd.Sum))
        want = sum(int_scaled(ints_of(k), 0.5, torch.int32) for k in range(n))
        same(copies[0], want, "grouped_allreduce_async_ int prescale, per rank")

    # reducescatter: integers, never a torch casting error
    with section("reducescatter on integers"):
        rows = torch.tensor(rows_ints(r), dtype=torch.int32)
        sums = [[1, 3], [5, -1], [-3, 4], [6, 7]]
        mine_rows = sums[2 * r:2 * r + 2]
        flat = [v for row in mine_rows for v in row]
        same(hvd.reducescatter(rows), int_scaled(flat, 0.5, torch.int32).reshape(2, 2),
             "int32 reducescatter Average")
        same(hvd.reducescatter(rows, op=hvd.Sum, postscale_factor=0.5),
             int_scaled(flat, 0.5, torch.int32).reshape(2, 2), "int32 reducescatter postscale")
        pre = sum(int_scaled(sum(rows_ints(k), []), 2.5, torch.int64) for k in range(n))
        same(hvd.reducescatter(rows.long(), op=hvd.Sum, prescale_factor=2.5),
             pre.reshape(4, 2)[2 * r:2 * r + 2], "int64 reducescatter prescale, per rank")
        same(hvd.synchronize(hvd.reducescatter_async(rows, op=hvd.Average)),
             int_scaled(flat, 0.5, torch.int32).reshape(2, 2), "int32 reducescatter_async")
        same(hvd.grouped_reducescatter([rows, rows])[1],
             int_scaled(flat, 0.5, torch.int32).reshape(2, 2), "int32 grouped_reducescatter")

    # float16 / bfloat16 reducescatter with factors: scaled in float32, rounded once (Horovod's
    # expectation); torch's own half *= factor is 1 ulp off for these
    with section("float16/bfloat16 reducescatter factors"):
        gen = np.random.RandomState(12345)
        values = np.arange(-40, 40, dtype=np.float32).reshape(16, 5) * 2.5 + 1.0
        mine_half = slice(8 * r, 8 * r + 8)
        for _ in range(3):
            factor = float(gen.uniform())
            f32 = np.float32(factor)
            for dtype, rounded in ((torch.float16, half_rounded), (torch.bfloat16, bf16_rounded)):
                x = torch.from_numpy(values).to(dtype)
                xs = x.float().numpy()
                got = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=factor)
                want = rounded(xs * f32).float() * n  # each rank's scaled input, summed exactly
                same(got, want[mine_half].to(dtype),
                     "%s reducescatter prescale %r" % (dtype, factor))
                got = hvd.reducescatter(x, op=hvd.Sum, postscale_factor=factor)
                want = rounded((xs * n) * f32)
                same(got, want[mine_half], "%s reducescatter postscale %r" % (dtype, factor))
                got = hvd.reducescatter(x, op=hvd.Average)
                same(got, rounded((xs * n) * np.float32(1.0 / n))[mine_half],
                     "%s reducescatter Average" % dtype)


# --- 3. autograd --------------------------------------------------------------------------------

def loss_weights(shape, k):
    """Rank k's loss is sum(out * loss_weights(out.shape, k)): a different weight everywhere."""
    count = int(np.prod(shape)) if len(shape) else 1
    return (torch.arange(count, dtype=torch.float64) * 0.25 + 1.0 + 10.0 * k).reshape(shape)


def reference_grads(fn, inputs, scale):
    """d(sum over ranks k of rank k's loss)/d(rank r's input), for every r, computed here on all
    ranks' inputs at once; times `scale`, Horovod's factor for the op (docs/horovod.md).
    fn(list of every rank's inputs) gives every rank's outputs."""
    leaves = [[t.detach().clone().requires_grad_() for t in per_rank] for per_rank in inputs]
    outputs = fn(leaves)
    total = sum((o * loss_weights(o.shape, k)).sum()
                for k, outs in enumerate(outputs) for o in outs)
    total.backward()
    return [[t.grad * scale if t.grad is not None else torch.zeros_like(t) for t in per_rank]
            for per_rank in leaves]


def backward_here(outs, r):
    total = sum((o * loss_weights(o.shape, r)).sum() for o in outs)
    total.backward()


def grad_case(r, n, what, make, distributed, simulated, scale):
    """make(k): rank k's inputs; distributed(inputs): this rank's outputs through hora.torch;
    simulated(all ranks' inputs): every rank's outputs."""
    with section(what):
        inputs = [t.requires_grad_() for t in make(r)]
        backward_here(distributed(inputs), r)
        want = reference_grads(simulated, [make(k) for k in range(n)], scale)[r]
        for i, (t, w) in enumerate(zip(inputs, want)):
            check(t.grad is not None, "%s: input %d got no gradient" % (what, i))
            close(t.grad, w, "%s: gradient of input %d" % (what, i))


def rows_of(k, base=0.0):
    return torch.arange(2.0 * (k + 1), dtype=torch.float64).reshape(k + 1, 2) + 10 * k + base


def blocks(t, n):
    """reducescatter's split of the first dimension: rows // n each, the first rows % n one more."""
    rows = t.shape[0]
    sizes = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    return list(torch.split(t, sizes))


def autograd(r, n, process_set=None, members=None):
    """Horovod's gradient of every differentiable op, against reference_grads. With a process
    set, `members` are its global ranks and r, n this rank's rank in it and its size."""
    ps = process_set or hvd.global_process_set
    kw = {"process_set": ps}
    def f64(count, cols):
        return torch.arange(float(count), dtype=torch.float64).reshape(-1, cols)

    def square(k):
        return f64(6, 2) * (k + 1) + k

    # allreduce: the same reduction of the gradient (scale 1)
    grad_case(r, n, "allreduce Sum, factors", lambda k: [square(k)],
              lambda x: [hvd.allreduce(x[0], op=hvd.Sum, prescale_factor=0.5,
                                       postscale_factor=4.0, **kw)],
              lambda xs: [[2.0 * sum(x[0] for x in xs)] for _ in xs], 1.0)
    grad_case(r, n, "allreduce Average", lambda k: [square(k)],
              lambda x: [hvd.allreduce(x[0], **kw)],
              lambda xs: [[sum(x[0] for x in xs) / n] for _ in xs], 1.0)
    # allgather: averaged over the set (scale 1/n); a different number of rows on each rank
    grad_case(r, n, "allgather", lambda k: [rows_of(k)],
              lambda x: [hvd.allgather(x[0], **kw)],
              lambda xs: [[torch.cat([x[0] for x in xs])] for _ in xs], 1.0 / n)
    # broadcast: averaged over the set, at the root only (root_rank: a global rank)
    root = n - 1
    global_root = members[root] if members else root
    grad_case(r, n, "broadcast", lambda k: [square(k)],
              lambda x: [hvd.broadcast(x[0], root_rank=global_root, **kw) * 1.0],
              lambda xs: [[xs[root][0] * 1.0] for _ in xs], 1.0 / n)
    grad_case(r, n, "grouped_allgather", lambda k: [rows_of(k), rows_of(n - 1 - k)[:1]],
              lambda x: hvd.grouped_allgather(x, **kw),
              lambda xs: [[torch.cat([x[i] for x in xs]) for i in range(2)] for _ in xs], 1.0 / n)
    grad_case(r, n, "grouped_allreduce", lambda k: [square(k), square(k)[0] * 3],
              lambda x: hvd.grouped_allreduce(x, **kw),
              lambda xs: [[sum(x[i] for x in xs) / n for i in range(2)] for _ in xs], 1.0)
    # alltoall: sent back (scale 1); received_splits not differentiable
    def splits(k):
        return [j + 1 for j in range(n)] if k % 2 == 0 else [1] * n
    def sends(k):
        return f64(2 * sum(splits(k)), 2) + 100 * k

    def to_all(xs):
        parts = [torch.split(x[0], splits(k)) for k, x in enumerate(xs)]
        return [[torch.cat([parts[k][j] for k in range(n)])] for j in range(n)]

    def distributed(x):
        out, received = hvd.alltoall(x[0], splits=splits(r), **kw)
        check(not received.requires_grad, "received_splits is not differentiable")
        same(received.to(torch.int64), torch.tensor([splits(k)[r] for k in range(n)]),
             "received_splits")
        return [out]
    grad_case(r, n, "alltoall with splits", lambda k: [sends(k)], distributed, to_all, 1.0)
    def even(k):
        return f64(2 * n, 2) * (k + 2)
    grad_case(r, n, "alltoall even", lambda k: [even(k)], lambda x: [hvd.alltoall(x[0], **kw)],
              lambda xs: [[torch.cat([x[0][j:j + 1] for x in xs])] for j in range(n)], 1.0)
    # reducescatter: gathered, times n for Sum and times the factors (scale n with the
    # factors in the function itself); uneven rows
    def tall(k):
        return f64(2 * (2 * n + 1), 2) - k
    grad_case(r, n, "reducescatter Sum, factors", lambda k: [tall(k)],
              lambda x: [hvd.reducescatter(x[0], op=hvd.Sum, prescale_factor=0.5,
                                           postscale_factor=4.0, **kw)],
              lambda xs: [[b] for b in blocks(2.0 * sum(x[0] for x in xs), n)], float(n))
    grad_case(r, n, "reducescatter Average", lambda k: [tall(k)],
              lambda x: [hvd.reducescatter(x[0], **kw)],
              lambda xs: [[b] for b in blocks(sum(x[0] for x in xs) / n, n)], float(n))
    grad_case(r, n, "grouped_reducescatter", lambda k: [tall(k), even(k)],
              lambda x: hvd.grouped_reducescatter(x, op=hvd.Sum, **kw),
              lambda xs: [[blocks(sum(x[0] for x in xs), n)[j], blocks(sum(x[1] for x in xs), n)[j]]
                          for j in range(n)], float(n))


# --- 4. process sets and join -------------------------------------------------------------------

def sets(r, n):
    """At 3 ranks: a process set of ranks 0 and 2 (broadcast's root_rank global, Average over
    the set, gradients by rank in the set), then Average while rank 2 has joined."""
    assert n == 3
    ps = hvd.add_process_set([0, 2])
    if ps.included():
        x = torch.tensor([1.0, 2.0]) * (r + 1)
        with section("process-set broadcast"):
            same(hvd.broadcast(x, root_rank=2, process_set=ps), torch.tensor([3.0, 6.0]),
                 "process-set broadcast from global rank 2")
            y = x.clone()
            hvd.broadcast_(y, root_rank=2, process_set=ps)
            same(y, torch.tensor([3.0, 6.0]), "process-set broadcast_")
            same(hvd.synchronize(hvd.broadcast_async(x, 0, process_set=ps)),
                 torch.tensor([1.0, 2.0]), "process-set broadcast_async from global rank 0")
            raises(ValueError, lambda: hvd.broadcast(x, root_rank=1, process_set=ps),
                   "root outside the set", ("root_rank 1", "[0, 2]"))
        with section("Average over the set"):
            same(hvd.allreduce(x, process_set=ps), torch.tensor([2.0, 4.0]),
                 "Average over the set")
            same(hvd.allreduce(torch.tensor([r + 2, 3 * r + 1]), process_set=ps),
                 torch.tensor([3, 4]), "int Average over the set: (2 + 4) / 2, (1 + 7) / 2")
        autograd(ps.rank(), 2, process_set=ps, members=[0, 2])
    hvd.barrier()
    check(hvd.remove_process_set(ps), "remove_process_set")

    if r == 2:
        last = hvd.join()
    else:
        x = torch.tensor([3.0, 5.0, 1.0]) * (r + 1)
        with section("Average with a rank joined"):
            close(hvd.allreduce(x), torch.tensor([9.0, 15.0, 3.0]) / 3,
                  "Average with rank 2 joined", tol=1e-6)
            same(hvd.allreduce(torch.tensor([r + 1, 4 * r + 1])), torch.tensor([1, 2]),
                 "int Average with rank 2 joined: round(3/3), round(6/3)")
            same(hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.5),
                 torch.tensor([4.5, 7.5, 1.5]), "Sum with rank 2 joined")
            outs = hvd.grouped_allreduce([x, x[:1] * 2])
            close(outs[1], torch.tensor([6.0]), "grouped Average with rank 2 joined", tol=1e-6)
        last = hvd.join()
    check(last in (0, 1), "join: the last rank to join is 0 or 1, got %r" % (last,))


# --- 5. one-sided refusals ----------------------------------------------------------------------

def rejected(calls, op_name_set, needle):
    """calls holds one hora_reject call, of that op, name and set, whose reason has needle."""
    return (len(calls) == 1 and tuple(calls[0][:3]) == op_name_set
            and needle in str(calls[0][3]))


def reject(r, n):
    """hora.torch's own errors reach the other ranks: first what it passes to hora_reject
    (recorded, the same refusals on every rank), then a refusal on one rank only, which the
    other rank's op of that name must fail on promptly, naming the rank and its reason."""
    original = getattr(hora._hora, "reject", None)  # pylint: disable=protected-access
    calls = []
    hora._hora.reject = lambda *a: calls.append(a)  # pylint: disable=protected-access
    try:
        raises(TypeError, lambda: hvd.allreduce("x", name="rec.a"), "non-tensor")
        check(rejected(calls, ("allreduce", "rec.a", 0), "torch.Tensor"),
              "one rejection of the named op: %r" % (calls,))
        del calls[:]
        raises(hora.UnsupportedError, lambda: hvd.allreduce_async(torch.ones(1), op=hvd.Adasum),
               "Adasum", ("Adasum",))
        check(rejected(calls, ("allreduce", "", 0), "Adasum"),
              "an unnamed op rejects its call-order name: %r" % (calls,))
        del calls[:]
        raises(TypeError, lambda: hvd.grouped_allgather([torch.ones(1), 3], name="rec.g"),
               "non-tensor in a group")
        check([c[:3] for c in calls] == [("allgather", "rec.g.0", 0), ("allgather", "rec.g.1", 0)],
              "every member of a grouped allgather rejected: %r" % (calls,))
        del calls[:]
        raises(TypeError, lambda: hvd.grouped_reducescatter_async([torch.ones(2), None]),
               "non-tensor in a grouped reducescatter")
        check([c[:3] for c in calls] == [("reducescatter", "", 0)] * 2,
              "two call-order names used up: %r" % (calls,))
        del calls[:]
        raises((TypeError, ValueError), lambda: hvd.reducescatter(
            torch.ones(2, dtype=torch.int32), prescale_factor="x"), "a bad factor")
        check([c[0] for c in calls] == ["reducescatter"], "bad factor rejected: %r" % (calls,))
        del calls[:]
        raises(hora.HoraError, lambda: hvd.broadcast(torch.ones(1), root_rank=n + 3, name="rec.b"),
               "a root out of range")
        check(calls == [], "hora's C layer rejects its own errors, not hora.torch: %r" % (calls,))
        ps = hvd.add_process_set([n - 1])
        if ps.included():
            raises(ValueError, lambda: hvd.broadcast(torch.ones(1), root_rank=0, process_set=ps),
                   "root outside a set", ("[%d]" % (n - 1),))
            check(rejected(calls, ("broadcast", "", ps.process_set_id), "root_rank 0"),
                  "a root outside the set rejected on the set: %r" % (calls,))
        hvd.remove_process_set(ps)
    finally:
        if original is None:
            del hora._hora.reject  # pylint: disable=protected-access
        else:
            hora._hora.reject = original  # pylint: disable=protected-access

    def one_sided(what, refuse, submit, reason):
        if r == 0:
            raises(Exception, refuse, what)
        else:
            start = time.time()
            raises(hora.HoraError, submit, "%s, refused by rank 0" % what, ("rank 0", reason))
            took = time.time() - start
            check(took < 10.0 * TIME_SCALE, "%s: failed after %.1f s" % (what, took))
    one_sided("Adasum", lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="one.adasum"),
              lambda: hvd.allreduce(torch.ones(2), name="one.adasum"), "Adasum")
    one_sided("a non-tensor", lambda: hvd.allgather([1.0]),
              lambda: hvd.allgather(torch.ones(1)), "torch.Tensor")
    one_sided("a group with a non-tensor", lambda: hvd.grouped_allgather([torch.ones(1), "x"]),
              lambda: hvd.grouped_allgather([torch.ones(1), torch.ones(1)]), "torch.Tensor")
    # call-order names stayed in step: the next unnamed ops match
    same(hvd.allgather(torch.tensor([r])), torch.arange(n), "the next unnamed allgather")
    same(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum), torch.tensor([float(n)]),
         "the next unnamed allreduce")


# --- 6. grouped allgather and reducescatter -----------------------------------------------------

def grouped(r, n):
    """Horovod's signatures and return values; handles that synchronize() takes; every member
    in flight at once."""
    params = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    check(params(hvd.grouped_allgather) == ["tensors", "name", "process_set"], "signature")
    check(params(hvd.grouped_allgather_async) == ["tensors", "name", "process_set"],
          "grouped_allgather_async signature")
    rs = ["tensors", "name", "op", "process_set", "prescale_factor", "postscale_factor"]
    check(params(hvd.grouped_reducescatter_async) == rs, "grouped_reducescatter_async signature")
    check(params(hvd.grouped_reducescatter) == rs[:2] + ["compression"] + rs[2:],
          "grouped_reducescatter signature")

    a = torch.full((r + 1, 2), float(r))
    b = torch.tensor([r, 10 * r], dtype=torch.int64)
    if r == 0:
        # submitted, not waited for: rank 1 submits its members only after this allreduce
        handle = hvd.grouped_allgather_async([a, b], name="g.early")
        same(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="g.after"), torch.tensor([float(n)]),
             "an op after an unfinished grouped_allgather_async")
    else:
        same(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="g.after"), torch.tensor([float(n)]),
             "an op before the grouped_allgather")
        handle = hvd.grouped_allgather_async([a, b], name="g.early")
    while not hvd.poll(handle):
        time.sleep(0.001)
    outs = hvd.synchronize(handle)
    check(isinstance(outs, list) and len(outs) == 2, "grouped_allgather_async gives a list")
    same(outs[0], torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)]),
         "grouped_allgather_async member 0")
    same(outs[1], torch.tensor([v for k in range(n) for v in (k, 10 * k)]),
         "grouped_allgather_async member 1")
    outs = hvd.grouped_allgather([b, a])
    check(isinstance(outs, list), "grouped_allgather gives a list")
    same(outs[1], torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)]),
         "grouped_allgather unnamed")

    c = torch.arange(4.0 * n).reshape(2 * n, 2) + r
    d = torch.arange(3.0 * n).reshape(n, 3) * (r + 1)
    c_sum = sum(torch.arange(4.0 * n).reshape(2 * n, 2) + k for k in range(n))
    d_sum = sum(torch.arange(3.0 * n).reshape(n, 3) * (k + 1) for k in range(n))
    handle = hvd.grouped_reducescatter_async([c, d], name="rs", op=hvd.Sum,
                                             prescale_factor=0.5, postscale_factor=4.0)
    outs = hvd.synchronize(handle)
    check(isinstance(outs, list) and len(outs) == 2, "grouped_reducescatter_async gives a list")
    same(outs[0], c_sum[2 * r:2 * r + 2] * 2, "grouped_reducescatter_async member 0")
    same(outs[1], d_sum[r:r + 1] * 2, "grouped_reducescatter_async member 1")
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([c, d]))
    same(outs[0], c_sum[2 * r:2 * r + 2] / n, "grouped_reducescatter_async Average (default)")
    outs = hvd.grouped_reducescatter([c, d], op=hvd.Average, compression=hvd.Compression.fp16)
    check(outs[0].dtype == torch.float32, "fp16 compression gives float32 back")
    same(outs[1], d_sum[r:r + 1] / n, "grouped_reducescatter with fp16 compression")


def main():
    what = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    {"dtypes": dtypes, "integers": integers, "autograd": autograd, "sets": sets,
     "reject": reject, "grouped": grouped}[what](r, n)
    hvd.shutdown()
    print("rank %d of %d: %s passed: %d" % (r, n, what, checks), flush=True)


if __name__ == "__main__":
    main()
