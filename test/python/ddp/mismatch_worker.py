# SPDX-License-Identifier: Apache-2.0
"""One rank of the disagreement tests of the "hora" backend, under a small process-group timeout
and no TORCH_DISTRIBUTED_DEBUG:

    mismatch: ranks that call the same collective with other shapes or dtypes fail at once, on
              every rank, with hora's MismatchError naming both sides (blocking, wait(),
              wait(timeout) and the future), and the group goes on working;
    skip:     rank 1 never calls a collective that rank 0 does (a blocking all_reduce, and an
              asynchronous broadcast on a second group): rank 0 fails within the group's timeout
              with a HoraTimeoutError naming the op (blocking, wait(), wait(timeout), the future),
              later ops on the group fail at once, and destroy_process_group returns promptly on
              both ranks.
    late:     rank 1 calls the allreduce after rank 0 timed out and reused its tensor: hora
              never writes into rank 0's tensor afterwards, and rank 1 fails (naming rank 0)
              rather than succeeding with a mixed result.

Every limit is checked in the rank itself; the test's watchdog (harness.run_ranks) kills the job
if a rank hangs anyway."""

import datetime
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
from time_scale import scaled  # noqa: E402


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hora  # noqa: E402
import hora.distributed  # noqa: E402

TIMEOUT_S = 3  # the process group's
SLACK_S = 5  # what an error may take beyond it (scaled)


def expect_error(call, cls, words, within):
    """Runs call(), which must raise hora's `cls` (a RuntimeError) mentioning every word of
    `words`, within `within` seconds. Returns (exception, seconds taken)."""
    start = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        took = time.monotonic() - start
        text = str(e)
        if type(e) is not cls:
            raise AssertionError("%r is a %s, expected %s" % (text, type(e).__name__, cls.__name__))
        missing = [w for w in words if w not in text]
        if missing:
            raise AssertionError("%r does not mention %s" % (text, missing))
        if took > within:
            raise AssertionError("%r came after %.1f s, over %.1f s" % (text, took, within))
        return e, took
    raise AssertionError("no error after %.1f s; expected %s mentioning %s"
                         % (time.monotonic() - start, cls.__name__, words))


def still_works(rank, size, what):
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((3,), float(size * (size + 1) // 2))):
        raise AssertionError("after %s: all_reduce gave %s" % (what, t))


def mismatch(rank, size):
    # a disagreement is found when every rank has called: at once, long before the timeout
    soon = scaled(TIMEOUT_S)
    others = "rank%s %s" % ("s" if size > 2 else "", ",".join(str(r) for r in range(1, size)))
    # shapes: rank 0 gives 10 elements, the others 12
    n = 10 if rank == 0 else 12
    e, took = expect_error(lambda: dist.all_reduce(torch.ones(n)), hora.MismatchError,
                           ["allreduce", "shape", "rank 0 [10]", others + " [12]"], soon)
    print("rank %d: shape mismatch raised after %.2f s: %s" % (rank, took, e), flush=True)
    still_works(rank, size, "a shape mismatch")

    # the same through wait(), wait(timeout) and the future
    work = dist.all_reduce(torch.ones(n), async_op=True)
    expect_error(work.wait, hora.MismatchError, ["allreduce", "shape"], soon)
    expect_error(work.wait, hora.MismatchError, ["allreduce", "shape"], soon)  # again: same error
    work = dist.all_reduce(torch.ones(n), async_op=True)
    expect_error(lambda: work.wait(timeout=datetime.timedelta(seconds=scaled(30))),
                 hora.MismatchError, ["allreduce", "shape"], soon)
    work = dist.all_gather([torch.empty(n) for _ in range(size)], torch.ones(n), async_op=True)
    future = work.get_future()
    expect_error(future.wait, hora.MismatchError, ["allgather", "dimensions"], soon)
    assert future.done()
    work = dist.broadcast(torch.ones(2, n), src=0, async_op=True)
    expect_error(lambda: work.wait(timeout=datetime.timedelta(milliseconds=scaled(10000))),
                 hora.MismatchError, ["broadcast", "shape", "[2,10]", "[2,12]"], soon)
    still_works(rank, size, "asynchronous shape mismatches")

    # dtypes: rank 0 float32, the others float64, same shape
    dtype = torch.float32 if rank == 0 else torch.float64
    e, took = expect_error(lambda: dist.all_reduce(torch.ones(10, dtype=dtype)),
                           hora.MismatchError,
                           ["allreduce", "dtype", "rank 0 float32", others + " float64"], soon)
    print("rank %d: dtype mismatch raised after %.2f s: %s" % (rank, took, e), flush=True)
    work = dist.all_reduce(torch.ones(10, dtype=dtype), async_op=True)
    expect_error(lambda: work.wait(timeout=datetime.timedelta(seconds=scaled(30))),
                 hora.MismatchError, ["allreduce", "dtype"], soon)
    still_works(rank, size, "dtype mismatches")
    dist.barrier()


def skip(rank, size):
    store = dist.distributed_c10d._get_default_store()
    # a second group, with its own (equal) timeout, for an asynchronous op
    sub = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=TIMEOUT_S))
    if rank == 0:
        start = time.monotonic()
        work = dist.broadcast(torch.ones(3), src=0, group=sub, async_op=True)
        e, took = expect_error(lambda: dist.all_reduce(torch.ones(4)), hora.HoraTimeoutError,
                               ["allreduce", "c10d.0.allreduce.", "Float[4]", "timeout of 3 s"],
                               scaled(TIMEOUT_S + SLACK_S))
        assert isinstance(e, TimeoutError)
        # not before the timeout either
        assert took >= TIMEOUT_S * 0.9, "timed out after %.2f s, before the timeout" % took
        print("rank 0: skipped allreduce raised after %.2f s: %s" % (took, e), flush=True)
        # the asynchronous op timed out meanwhile: wait(timeout), wait() and its future raise
        words = ["broadcast", "Float[3]", "timeout of 3 s"]
        expect_error(lambda: work.wait(timeout=datetime.timedelta(seconds=scaled(30))),
                     hora.HoraTimeoutError, words, scaled(1))
        expect_error(work.wait, hora.HoraTimeoutError, words, scaled(1))
        expect_error(work.get_future().wait, hora.HoraTimeoutError, words, scaled(1))
        # the group has failed: a later op fails at once, naming the op that timed out
        expect_error(lambda: dist.broadcast(torch.ones(2), src=0), hora.HoraTimeoutError,
                     ["broadcast", "group failed", "allreduce"], scaled(1))
        work_start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), async_op=True)
            raise AssertionError("an op on the failed group was accepted")
        except hora.HoraTimeoutError:
            assert time.monotonic() - work_start < scaled(1)
        store.set("mismatch_worker.rank0_done", "1")
        destroy_start = time.monotonic()
        dist.destroy_process_group()
        took = time.monotonic() - destroy_start
        assert took < scaled(TIMEOUT_S), "destroy_process_group took %.2f s" % took
        print("rank 0: destroy_process_group took %.2f s, %.2f s after the call"
              % (took, time.monotonic() - start), flush=True)
        # rank 1 reads the key before rank 0's store server goes with this process
        store.wait(["mismatch_worker.rank1_bye"], datetime.timedelta(seconds=scaled(30)))
    else:
        # never calls the allreduce; destroys its group while rank 0 still waits
        destroy_start = time.monotonic()
        dist.destroy_process_group()
        took = time.monotonic() - destroy_start
        assert took < scaled(TIMEOUT_S), "destroy_process_group took %.2f s" % took
        print("rank %d: destroy_process_group took %.2f s" % (rank, took), flush=True)
        # stays up (hora running) until rank 0 has seen its timeout: hora shutting down here
        # would fail rank 0's op with ShutDownError instead
        store.wait(["mismatch_worker.rank0_done"],
                   datetime.timedelta(seconds=scaled(TIMEOUT_S + SLACK_S + 10)))
        store.set("mismatch_worker.rank1_bye", "1")


def late(rank, size):
    """Rank 1 calls an allreduce 2x the group's timeout after rank 0, which has timed out and
    reused its tensor by then: the op is over in hora on rank 0 (nothing writes into its tensor
    later, not even after destroy_process_group), and rank 1 fails instead of getting a result
    mixed from rank 0's new contents."""
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        e, took = expect_error(lambda: dist.all_reduce(t), hora.HoraTimeoutError,
                               ["allreduce", "timeout of 3 s"], scaled(TIMEOUT_S + SLACK_S))
        t.fill_(100.0)  # the caller's tensor is its own again
        print("rank 0: allreduce timed out after %.2f s; tensor reused" % took, flush=True)
        store.set("late.rank0_reused", "1")
        store.wait(["late.rank1_done"], datetime.timedelta(seconds=scaled(60)))
        time.sleep(0.5)
        assert torch.equal(t, torch.full((4,), 100.0)), "hora wrote into the tensor: %s" % t
        destroy_start = time.monotonic()
        dist.destroy_process_group()
        assert time.monotonic() - destroy_start < scaled(TIMEOUT_S)
        time.sleep(0.5)
        assert torch.equal(t, torch.full((4,), 100.0)), "hora wrote into it later: %s" % t
        store.set("late.rank0_bye", "1")
    else:
        store.wait(["late.rank0_reused"], datetime.timedelta(seconds=scaled(60)))
        # about 2x the timeout after rank 0's call
        time.sleep(max(0.0, 2 * TIMEOUT_S - TIMEOUT_S))
        start = time.monotonic()
        try:
            dist.all_reduce(t)
        except hora.HoraError as e:
            took = time.monotonic() - start
            assert took < scaled(10), "the late rank failed only after %.1f s: %s" % (took, e)
            assert "rank 0" in str(e), "the error does not name rank 0: %s" % e
            print("rank 1: late allreduce failed after %.2f s: %s" % (took, e), flush=True)
        else:
            raise AssertionError("the late allreduce succeeded with %s (rank 0 had given up)" % t)
        store.set("late.rank1_done", "1")
        dist.destroy_process_group()
        store.wait(["late.rank0_bye"], datetime.timedelta(seconds=scaled(60)))


def main():
    mode = sys.argv[1]
    os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    dist.init_process_group("hora", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size >= 2, "run at 2 or more ranks"
    if mode == "mismatch":
        mismatch(rank, size)
        dist.destroy_process_group()
    elif mode == "late":
        late(rank, size)
    else:
        skip(rank, size)
    print("rank %d of %d: %s ok" % (rank, size, mode), flush=True)


if __name__ == "__main__":
    main()
