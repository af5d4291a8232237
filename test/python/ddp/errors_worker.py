# SPDX-License-Identifier: Apache-2.0
"""One rank of the error-path test of the "hora" backend: each failure raises an exception that
names the op and says why, of hora's class for it, and the group works again afterwards."""

import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
from time_scale import scaled  # noqa: E402


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hora  # noqa: E402
import hora.distributed  # noqa: E402

ReduceOp = dist.ReduceOp


def expect_error(call, cls, *words):
    """Runs call(), which must raise hora's exception class `cls` (a RuntimeError, with the C
    status of that class) with a message mentioning `words`."""
    try:
        call()
    except RuntimeError as e:
        text = str(e)
        if type(e) is not cls or hora.error_class(e.status) is not cls:
            raise AssertionError("%r is a %s (status %s), expected %s"
                                 % (text, type(e).__name__, getattr(e, "status", None),
                                    cls.__name__))
        missing = [w for w in words if w not in text]
        if missing:
            raise AssertionError("%r does not mention %s" % (text, missing))
        return e
    raise AssertionError("no error; expected %s mentioning %s" % (cls.__name__, words))


def still_works(rank, size, what):
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((3,), float(size * (size + 1) // 2))):
        raise AssertionError("after %s: all_reduce gave %s" % (what, t))


def main():
    os.environ.setdefault("HORA_TIMEOUT_S", "60")
    # a name some ranks never submit fails after 2 s (the last check below)
    os.environ["HORA_STALL_WARNING_S"] = "1"
    os.environ["HORA_STALL_SHUTDOWN_S"] = str(scaled(2))
    # torch's debug level: ops named by their place in the group's sequence, so that ranks
    # disagreeing at one place fail at once with hora's mismatch error
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "INFO"
    dist.init_process_group("hora")
    rank, size = dist.get_rank(), dist.get_world_size()
    mismatch, unsupported, invalid = (hora.MismatchError, hora.UnsupportedError,
                                      hora.InvalidArgumentError)

    if size > 1:
        # shapes that differ across ranks: every rank's op fails with hora's mismatch error
        expect_error(lambda: dist.all_reduce(torch.ones(rank + 2)), mismatch, "allreduce", "shape")
        still_works(rank, size, "a shape mismatch")
        # ... also when waited for asynchronously: through wait() and through the future
        work = dist.all_reduce(torch.ones(2, rank + 1), async_op=True)
        expect_error(work.wait, mismatch, "allreduce", "shape")
        work = dist.all_gather([torch.empty(rank + 1) for _ in range(size)],
                               torch.ones(rank + 1), async_op=True)
        future = work.get_future()
        expect_error(future.wait, mismatch, "allgather")
        assert future.done()
        still_works(rank, size, "asynchronous mismatches")
        # dtypes that differ
        expect_error(lambda: dist.broadcast(torch.ones(3, dtype=torch.float32 if rank else
                                                       torch.float64), src=0),
                     mismatch, "broadcast")
        # ranks that call different collectives at the same point of the group's sequence
        if rank == 0:
            expect_error(lambda: dist.all_reduce(torch.ones(4)), mismatch, "allreduce")
        else:
            expect_error(lambda: dist.broadcast(torch.ones(4), src=0), mismatch, "broadcast")
        still_works(rank, size, "ops that differ across ranks")
        # a wait() that gives up: the op stays in flight and completes later. The other ranks
        # submit theirs only once rank 0's wait has given up (told through the job's store), so
        # the op cannot complete first however the ranks are scheduled.
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            t = torch.ones(2)
            work = dist.all_reduce(t, async_op=True)
            e = expect_error(lambda: work.wait(timeout=datetime.timedelta(milliseconds=100)),
                             hora.HoraTimeoutError, "allreduce", "still in flight")
            assert isinstance(e, TimeoutError)
            store.set("errors_worker.gave_up", "1")
            work.wait()
            assert torch.equal(t, torch.full((2,), float(size))), t
        else:
            store.wait(["errors_worker.gave_up"])
            dist.all_reduce(torch.ones(2))

    # refused on every rank before anything reaches hora: the group's sequence stays in step
    expect_error(lambda: dist.broadcast(torch.ones(3, dtype=torch.complex64), 0), unsupported,
                 "broadcast", "ComplexFloat")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16), op=ReduceOp.AVG),
                 unsupported, "allreduce", "AVERAGE", "int16")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=ReduceOp.AVG),
                 unsupported, "allreduce", "AVG", "bool")
    expect_error(lambda: dist.all_reduce(torch.ones(3), op=ReduceOp.BAND), unsupported,
                 "allreduce", "BAND", "Float")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=ReduceOp.AVG),
                 unsupported, "allreduce", "AVERAGE")
    expect_error(lambda: dist.all_gather([torch.empty(3)] * (size + 1), torch.ones(3)), invalid,
                 "allgather", "%d output tensors" % size)
    expect_error(lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size),
                                                input_split_sizes=[1] * (size + 1)),
                 invalid, "alltoall_base", "input_split_sizes")
    expect_error(lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(3)] * size), invalid,
                 "reduce_scatter", "size")
    expect_error(lambda: dist.send(torch.ones(1), dst=0), unsupported, "send", "point-to-point")
    expect_error(lambda: dist.recv(torch.ones(1), src=0), unsupported, "recv", "point-to-point")
    # A tensor on a device the backend does not take: meta here (torch's dispatcher lets an
    # allgather with CPU outputs through). A CUDA tensor takes the same path in an extension
    # built without CUDA, as with Debian's CPU torch; checked below where a GPU is there.
    cpu_only = not hora.distributed.CUDA
    expect_error(lambda: dist.all_gather([torch.empty(3) for _ in range(size)],
                                         torch.empty(3, device="meta")),
                 unsupported, "allgather", "input is on meta",
                 "CPU tensors only" if cpu_only else "CPU and CUDA tensors")
    if cpu_only and torch.cuda.is_available():
        device = "cuda:%d" % (rank % torch.cuda.device_count())
        expect_error(lambda: dist.all_reduce(torch.ones(3, device=device)), unsupported,
                     "allreduce", "input is on " + device, "CPU tensors only")
    still_works(rank, size, "refused calls")

    # a group whose ranks are not hora's
    expect_error(lambda: hora.distributed.ProcessGroupHora((rank + 1) % (size + 1), size + 1, 0,
                                                           "wrong"),
                 invalid, "rank %d of %d" % ((rank + 1) % (size + 1), size + 1))

    if size > 1:
        # Without the debug level, names follow each op's kind and count (so that hora's cache
        # answers them step after step), the same on every rank whatever the tensors: shapes
        # that differ fail at once with hora's mismatch error too, and the group goes on.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "OFF"
        fast = dist.new_group(list(range(size)))
        expect_error(lambda: dist.all_reduce(torch.ones(rank + 2), group=fast), mismatch,
                     "allreduce", "shape")
        t = torch.full((5,), 1.0)
        dist.all_reduce(t, group=fast)
        assert torch.equal(t, torch.full((5,), float(size))), t
        # Ranks that call different collectives at the same point submit different names,
        # which hora reports as a stall and, with HORA_STALL_SHUTDOWN_S, fails on the ranks
        # that submitted them. The members' sequences no longer line up: the group fails, and
        # a later op on it fails at once.
        if rank == 0:
            e = expect_error(lambda: dist.all_reduce(torch.ones(4), group=fast),
                             hora.HoraTimeoutError, "allreduce", "stalled", "never by rank")
        else:
            e = expect_error(lambda: dist.broadcast(torch.ones(4), src=0, group=fast),
                             hora.HoraTimeoutError, "broadcast", "stalled", "never by rank")
        assert isinstance(e, TimeoutError)
        expect_error(lambda: dist.all_reduce(torch.ones(5), group=fast), hora.HoraTimeoutError,
                     "allreduce", "group failed", "stalled")

    dist.barrier()
    dist.destroy_process_group()
    print("rank %d of %d: every error named its op" % (rank, size), flush=True)


if __name__ == "__main__":
    main()
