# SPDX-License-Identifier: Apache-2.0
"""Rank program of test_core.py: every binding of `hora` on numpy arrays and torch tensors.

Each rank knows what every rank submits (a function of the rank), so it computes each expected
result itself, with numpy or plain Python, and compares. Prints "core checks passed: N" at the
end; any failure raises (and the launcher fails the job).
"""

import os
import sys
import threading
import time

import numpy as np

import hora

try:
    import torch
except ImportError:  # the numpy checks still run
    torch = None

checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError("rank %d: %s" % (hora.rank(), what))
    checks += 1


def equal(got, want, what):
    got = np.asarray(got.float() if torch is not None and isinstance(got, torch.Tensor)
                     and got.dtype == torch.bfloat16 else got)
    check(got.shape == np.shape(want) and np.array_equal(got, want),
          "%s: got %r, want %r" % (what, got, want))


def expect_error(cls, fn, what, *words):
    try:
        fn()
    except cls as e:
        check(isinstance(e, hora.HoraError) and e.status == cls.status,
              "%s: status %r" % (what, getattr(e, "status", None)))
        for word in words:
            check(word in str(e), "%s: %r not in the message %r" % (what, word, str(e)))
        return e
    raise AssertionError("rank %d: %s did not raise %s" % (hora.rank(), what, cls.__name__))


def before_init():
    check(not hora.is_initialized() and hora.rank() == -1, "not initialized before init")
    expect_error(hora.NotInitializedError, lambda: hora.allreduce(np.ones(2)),
                 "allreduce before init")


def topology(r, n):
    want_rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    want_size = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    check((r, n) == (int(want_rank), int(want_size)), "rank/size %d/%d vs the launcher's %s/%s"
          % (r, n, want_rank, want_size))
    check(hora.local_size() == n and hora.local_rank() == r, "one host: local = world")
    check(hora.cross_size() == 1 and hora.cross_rank() == 0, "one host: cross = 1")


def numpy_allreduce(r, n):
    base = np.arange(6).reshape(2, 3)
    for dtype in (np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64):
        mine = (base + r).astype(dtype)
        every = [(base + k).astype(np.float64) for k in range(n)]
        equal(hora.allreduce(mine, op=hora.Sum), sum(every).astype(dtype), "Sum %s" % dtype)
        equal(hora.allreduce(mine, op=hora.Min), base.astype(dtype), "Min %s" % dtype)
        equal(hora.allreduce(mine, op=hora.Max), (base + n - 1).astype(dtype), "Max %s" % dtype)
        small = (base % 2 + r + 1).astype(dtype)
        product = np.prod([(base % 2 + k + 1) for k in range(n)], axis=0)
        equal(hora.allreduce(small, op=hora.Product), product.astype(dtype),
              "Product %s" % dtype)
        equal(mine, (base + r).astype(dtype), "out-of-place leaves the input")
        if np.issubdtype(dtype, np.floating):
            equal(hora.allreduce(mine), (sum(every) / n).astype(dtype), "Average %s" % dtype)
            scaled = hora.allreduce(mine, op=hora.Sum, prescale_factor=0.5, postscale_factor=4)
            equal(scaled, (sum(every) * 2).astype(dtype), "pre/postscale %s" % dtype)
        else:
            expect_error(hora.UnsupportedError, lambda: hora.allreduce(mine, name="avg.int"),
                         "Average on %s" % dtype, "avg.int")

    x = np.full(5, float(r + 1))
    same = hora.allreduce_(x, op=hora.Sum)
    check(same is x, "allreduce_ returns its tensor")
    equal(x, np.full(5, n * (n + 1) / 2), "allreduce_ in place")

    # a strided view goes through a copy; the columns it skips are left alone
    grid = np.full((3, 4), float(r))
    hora.allreduce_(grid[:, ::2], op=hora.Max)
    want = np.full((3, 4), float(r))
    want[:, ::2] = n - 1
    equal(grid, want, "allreduce_ on a non-contiguous view")
    frozen = np.full(3, 2.0)
    frozen.flags.writeable = False
    equal(hora.allreduce(frozen, op=hora.Sum), np.full(3, 2.0 * n), "read-only input")
    equal(hora.allreduce(np.array(float(r)), op=hora.Sum), np.array(n * (n - 1) / 2), "0-d array")


def torch_allreduce(r, n):
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                  torch.int32, torch.uint8):
        mine = (torch.arange(8) % 4 + r).to(dtype)
        want = sum((np.arange(8) % 4 + k) for k in range(n))
        got = hora.allreduce(mine, op=hora.Sum, name="torch.sum.%s" % dtype)
        check(isinstance(got, torch.Tensor) and got.dtype == dtype and got.device == mine.device,
              "torch result keeps dtype %s and device" % dtype)
        equal(got, want.astype(np.float32 if dtype == torch.bfloat16 else
                               got.numpy().dtype), "torch Sum %s" % dtype)

    weight = torch.full((4,), float(r), requires_grad=True)
    avg = hora.allreduce(weight)
    check(not avg.requires_grad, "result of a tensor requiring grad is plain data")
    equal(avg, np.full(4, (n - 1) / 2, np.float32), "Average of a tensor requiring grad")
    hora.allreduce_(weight, op=hora.Max)
    equal(weight.detach(), np.full(4, n - 1, np.float32), "in place through .detach()")

    column = torch.zeros(3, 2)
    column[:, 1] = r + 1
    hora.allreduce_(column[:, 1], op=hora.Sum)
    equal(column, np.stack([np.zeros(3), np.full(3, n * (n + 1) / 2)], 1).astype(np.float32),
          "torch non-contiguous in place")

    group = [torch.full((k + 1,), float(r + k)) for k in range(4)]
    outs = hora.grouped_allreduce(group, op=hora.Sum)
    for k, out in enumerate(outs):
        equal(out, np.full(k + 1, sum(j + k for j in range(n)), np.float32), "grouped %d" % k)
    same = hora.grouped_allreduce_(group, op=hora.Min)
    check(same[0] is group[0], "grouped_allreduce_ returns its tensors")
    for k, t in enumerate(group):
        equal(t, np.full(k + 1, float(k), np.float32), "grouped in place %d" % k)


def gather_broadcast_alltoall(r, n):
    # allgather: rank k gives k+1 rows of value k
    mine = np.full((r + 1, 2), r, np.int32)
    want = np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)])
    equal(hora.allgather(mine), want, "numpy allgather")
    t = hora.allgather(torch.full((r + 1, 2), float(r), dtype=torch.bfloat16))
    check(t.dtype == torch.bfloat16, "allgather keeps bfloat16")
    equal(t, want.astype(np.float32), "torch bfloat16 allgather")

    root = n - 1
    x = np.arange(4, dtype=np.float64) * (r + 1)
    got = hora.broadcast(x, root_rank=root)
    equal(got, np.arange(4, dtype=np.float64) * n, "broadcast")
    equal(x, np.arange(4, dtype=np.float64) * (r + 1), "broadcast leaves its input")
    y = torch.full((2, 2), float(r))
    hora.broadcast_(y, root_rank=0)
    equal(y, np.zeros((2, 2), np.float32), "broadcast_ in place")

    # alltoall: rank r sends i+1 rows of value 100r+i to rank i
    rows = np.concatenate([np.full((i + 1, 3), 100 * r + i, np.float32) for i in range(n)])
    out, received = hora.alltoall(rows, splits=[i + 1 for i in range(n)])
    equal(out, np.concatenate([np.full((r + 1, 3), 100 * k + r, np.float32)
                               for k in range(n)]), "alltoall with splits")
    equal(received, np.full(n, r + 1, np.int64), "alltoall received splits")
    even = torch.arange(2 * n, dtype=torch.int64) + 10 * r
    out = hora.alltoall(even)
    equal(out, np.array([10 * k + 2 * r + j for k in range(n) for j in range(2)]),
          "alltoall even split")

    # reducescatter: 2n+1 rows; rank k gets rows [start, stop)
    total_rows = 2 * n + 1
    data = np.arange(total_rows * 2, dtype=np.float32).reshape(total_rows, 2) + r
    summed = sum(np.arange(total_rows * 2, dtype=np.float32).reshape(total_rows, 2) + k
                 for k in range(n))
    sizes = [total_rows // n + (1 if k < total_rows % n else 0) for k in range(n)]
    start = sum(sizes[:r])
    equal(hora.reducescatter(data, op=hora.Sum), summed[start:start + sizes[r]],
          "reducescatter Sum")
    equal(hora.reducescatter(data, postscale_factor=2.0), summed[start:start + sizes[r]] / n * 2,
          "reducescatter Average, postscaled")


def async_any_order(r, n):
    # every rank submits the same names in its own order; hora matches them by name
    names = ["grad.%d" % k for k in range(6)]
    order = names if r % 2 == 0 else list(reversed(names))
    tensors = {name: np.full(100 * (k + 1), float(r + k), np.float32)
               for k, name in enumerate(names)}
    handles = {name: hora.allreduce_async_(tensors[name], op=hora.Sum, name=name)
               for name in order}
    while not all(hora.poll(h) for h in handles.values()):
        time.sleep(0.001)
    for k, name in enumerate(names):
        check(hora.synchronize(handles[name]) is tensors[name], "synchronize returns the tensor")
        equal(tensors[name], np.full(100 * (k + 1), sum(j + k for j in range(n)), np.float32),
              "async %s" % name)
    check(handles[names[0]].wait() is tensors[names[0]], "a second wait returns the result")
    # A stream-ordered wait on host tensors is the host wait (no stream to order), result and all;
    # an allgather's output, made by hora, comes with it.
    gathered = hora.synchronize(hora.allgather_async(np.full((1, 2), r, np.int32)), stream=0)
    equal(gathered, np.repeat(np.arange(n, dtype=np.int32), 2).reshape(n, 2), "allgather, stream wait")


def gil_released(r, n):
    """While one thread waits in hora for a late rank, another runs Python."""
    if n < 2:
        return
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    spinner = threading.Thread(target=spin)
    spinner.start()
    if r == n - 1:
        time.sleep(0.5)
    before = ticks[0]
    hora.allreduce(np.ones(1), op=hora.Sum, name="late")
    during = ticks[0] - before
    stop.set()
    spinner.join()
    if r == 0:
        check(during > 50, "other threads ran while rank 0 waited (%d ticks)" % during)


def errors(r, n):
    if n > 1:
        shape = (3,) if r == 0 else (4,)
        e = expect_error(hora.MismatchError,
                         lambda: hora.allreduce(np.ones(shape), name="bad.shape"),
                         "mismatched shapes", "bad.shape")
        check(isinstance(e, RuntimeError), "hora's errors are RuntimeErrors")
        equal(hora.allreduce(np.ones(2), op=hora.Sum, name="after.mismatch"),
              np.full(2, float(n)), "the runtime stays usable after a mismatch")

    e = expect_error(hora.InvalidArgumentError, lambda: hora.broadcast(np.ones(2), root_rank=n + 5,
                                                                       name="bad.root"),
                     "root out of range", "bad.root")
    check(isinstance(e, ValueError), "InvalidArgumentError is a ValueError")

    # A name is in flight until its op completes, and nothing but the scheduler decides whether a
    # second submission comes before that, unless the op cannot complete yet: so rank 0 submits
    # "twice" and tries again while the other ranks hold theirs back behind a barrier. Alone, the
    # op may complete first; then a second submission is legal, but only once the first is done.
    if r == 0:
        first = hora.allreduce_async(np.ones(2), op=hora.Sum, name="twice")
        if n > 1:
            expect_error(hora.DuplicateNameError,
                         lambda: hora.allreduce_async(np.ones(2), name="twice"),
                         "a name in flight twice", "twice")
        else:
            try:
                second = hora.allreduce_async(np.ones(2), op=hora.Sum, name="twice")
            except hora.DuplicateNameError:
                pass
            else:
                check(first.poll(), "a second 'twice' accepted while the first was in flight")
                equal(second.wait(), np.ones(2), "the second 'twice', alone")
    hora.barrier()
    if r != 0:
        first = hora.allreduce_async(np.ones(2), op=hora.Sum, name="twice")
    equal(first.wait(), np.full(2, float(n)), "the first of the duplicates completes")

    try:
        hora.allreduce(object())
    except TypeError as e:
        check("__dlpack__" in str(e), "non-tensor: TypeError naming __dlpack__")
    else:
        raise AssertionError("allreduce(object()) did not raise")


def process_sets(r, n):
    if n < 2:
        return
    members = [0, n - 1] if n > 2 else [1]  # (a set of every rank is the global set, id 0)
    ps = hora.add_process_set(members)
    check(ps.process_set_id > 0 and ps.size() == len(members), "process set registered: %r" % ps)
    check(ps.included() == (r in members), "included()")
    if ps.included():
        check(ps.rank() == members.index(r), "rank within the set")
        equal(hora.allreduce(np.full(2, float(r)), op=hora.Sum, process_set=ps),
              np.full(2, float(sum(members))), "allreduce on a process set")
        hora.barrier(process_set=ps)
    hora.barrier()
    check(hora.remove_process_set(ps) and ps.process_set_id is None, "remove_process_set")
    check(not hora.remove_process_set(hora.global_process_set), "the global set stays")


def join_and_timeline(r, n, out_dir):
    # every rank but 0 joins at once; rank 0's allreduce completes with zeros from them
    if r == 0:
        equal(hora.allreduce(np.ones(3), op=hora.Sum, name="after.join"), np.ones(3),
              "allreduce with the other ranks joined")
    last = hora.join()
    check(last == 0, "last joined rank %d, want 0" % last)

    path = os.path.join(out_dir, "trace.{rank}.json")
    hora.start_timeline(path)
    hora.allreduce(np.ones(16), name="traced")
    hora.stop_timeline()
    with open(path.replace("{rank}", str(r))) as f:
        trace = f.read()
    check('"traced"' in trace and "ALLREDUCE" in trace, "timeline names the op")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    before_init()
    hora.init()
    r, n = hora.rank(), hora.size()
    topology(r, n)
    numpy_allreduce(r, n)
    if torch is not None:
        torch_allreduce(r, n)
        gather_broadcast_alltoall(r, n)
    async_any_order(r, n)
    gil_released(r, n)
    errors(r, n)
    process_sets(r, n)
    join_and_timeline(r, n, out_dir)
    hora.shutdown()
    check(not hora.is_initialized(), "shut down")
    print("rank %d of %d: core checks passed: %d" % (r, n, checks), flush=True)


if __name__ == "__main__":
    main()
