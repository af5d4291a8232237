# SPDX-License-Identifier: Apache-2.0
"""One rank of the collectives test of the "hora" torch.distributed backend.

Every expected value is computed here from what each rank contributes (rank r's tensor is a known
function of r), never with a collective. Started by test_c10d.py under horarun or mpirun."""

import os
import sys
import threading
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

warnings.filterwarnings("ignore", message=".*all_gather_coalesced will be deprecated")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hora.distributed  # noqa: E402,F401  (registers the backend)

ReduceOp = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16]


def contribution(rank, shape=(2, 3), dtype=torch.float32):
    """Rank `rank`'s tensor: small values that every dtype holds exactly, and whose products and
    sums over 3 ranks stay exact (below 127, below 2**8 significand bits)."""
    n = 1
    for d in shape:
        n *= d
    values = (torch.arange(n, dtype=torch.int64) % 4) + rank + 1
    if dtype == torch.bool:
        return ((torch.arange(n) + rank) % 2 == 0).reshape(shape)
    return values.reshape(shape).to(dtype)


def fold(op, tensors):
    """The reduction of the ranks' tensors, computed locally."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op == ReduceOp.SUM or op == ReduceOp.AVG:
            acc = acc + t
        elif op == ReduceOp.PRODUCT:
            acc = acc * t
        elif op == ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        elif op == ReduceOp.MAX:
            acc = torch.maximum(acc, t)
        elif op == ReduceOp.BAND:
            acc = acc & t
        elif op == ReduceOp.BOR:
            acc = acc | t
        elif op == ReduceOp.BXOR:
            acc = acc ^ t
    if op == ReduceOp.AVG:
        acc = (acc.double() / len(tensors)).to(tensors[0].dtype)
    return acc


def same(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError("%s: got %s %s, want %s %s" % (what, got.dtype, got, want.dtype, want))


def close(got, want, what, tol=1e-2):
    if got.dtype != want.dtype or not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
        raise AssertionError("%s: got %s, want %s" % (what, got, want))


def check_allreduce(rank, size):
    for dtype in FLOATS + INTS:
        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
            t = contribution(rank, dtype=dtype)
            dist.all_reduce(t, op=op)
            same(t, fold(op, [contribution(r, dtype=dtype) for r in range(size)]),
                 "all_reduce %s %s" % (op, dtype))
    for dtype in FLOATS:
        t = contribution(rank, dtype=dtype)
        dist.all_reduce(t, op=ReduceOp.AVG)
        close(t, fold(ReduceOp.AVG, [contribution(r, dtype=dtype) for r in range(size)]),
              "all_reduce AVG %s" % dtype)
        t = contribution(rank, dtype=dtype)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        close(t, fold(ReduceOp.SUM, [contribution(r, dtype=dtype) * 0.5 for r in range(size)]),
              "all_reduce PREMUL_SUM(0.5) %s" % dtype)
    for dtype in INTS + [torch.bool]:
        for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
            t = contribution(rank, dtype=dtype)
            dist.all_reduce(t, op=op)
            same(t, fold(op, [contribution(r, dtype=dtype) for r in range(size)]),
                 "all_reduce %s %s" % (op, dtype))
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        t = contribution(rank, dtype=torch.bool)
        dist.all_reduce(t, op=op)
        want = fold({ReduceOp.PRODUCT: ReduceOp.BAND, ReduceOp.SUM: ReduceOp.BOR}.get(op, op),
                    [contribution(r, dtype=torch.bool) for r in range(size)])
        same(t, want, "all_reduce %s bool" % op)
    # a scalar, an empty tensor, and a non-contiguous view (the result lands in the view)
    t = torch.tensor(float(rank + 1))
    dist.all_reduce(t)
    same(t, torch.tensor(float(size * (size + 1) // 2)), "all_reduce of a 0-d tensor")
    t = torch.empty(0)
    dist.all_reduce(t)
    base = contribution(rank, shape=(3, 4)).t()
    assert not base.is_contiguous()
    dist.all_reduce(base)
    same(base, fold(ReduceOp.SUM, [contribution(r, shape=(3, 4)) for r in range(size)]).t(),
         "all_reduce of a transposed view")
    # all_reduce_coalesced: several tensors, one request
    ts = [contribution(rank, (5,)), contribution(rank, (2, 2)) * 2]
    dist.all_reduce_coalesced(ts, op=ReduceOp.MAX)
    same(ts[0], fold(ReduceOp.MAX, [contribution(r, (5,)) for r in range(size)]), "coalesced 0")
    same(ts[1], fold(ReduceOp.MAX, [contribution(r, (2, 2)) * 2 for r in range(size)]),
         "coalesced 1")
    # complex: torch hands SUM over as a real view
    c = torch.complex(contribution(rank, (3,)), -contribution(rank, (3,)))
    dist.all_reduce(c)
    want = fold(ReduceOp.SUM, [contribution(r, (3,)) for r in range(size)])
    same(c, torch.complex(want, -want), "all_reduce complex64")


def check_reduce_broadcast(rank, size):
    for root in range(size):
        t = contribution(rank, dtype=torch.bfloat16)
        before = t.clone()
        dist.reduce(t, dst=root, op=ReduceOp.SUM)
        if rank == root:
            same(t, fold(ReduceOp.SUM, [contribution(r, dtype=torch.bfloat16) for r in range(size)]),
                 "reduce to %d" % root)
        else:
            same(t, before, "reduce leaves non-root %d" % rank)
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            t = contribution(rank, dtype=dtype)
            dist.broadcast(t, src=root)
            same(t, contribution(root, dtype=dtype), "broadcast %s from %d" % (dtype, root))
    # in place into a strided view
    full = torch.zeros(4, 4)
    view = full[:, 1]
    view.copy_(contribution(rank, (4,)))
    dist.broadcast(view, src=size - 1)
    same(full[:, 1], contribution(size - 1, (4,)), "broadcast into a column")
    same(full[:, 0], torch.zeros(4), "broadcast touches only the column")
    objects = [{"rank": rank}, "x" * (rank + 1)]
    dist.broadcast_object_list(objects, src=0)
    assert objects == [{"rank": 0}, "x"], objects


def check_gathers(rank, size):
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.bool):
        outs = [torch.empty(2, 3, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, contribution(rank, dtype=dtype))
        for r in range(size):
            same(outs[r], contribution(r, dtype=dtype), "all_gather %s from %d" % (dtype, r))
        out = torch.empty(size * 2, 3, dtype=dtype)
        dist.all_gather_into_tensor(out, contribution(rank, dtype=dtype))
        same(out, torch.cat([contribution(r, dtype=dtype) for r in range(size)]),
             "all_gather_into_tensor (_allgather_base) %s" % dtype)
    lists = [[torch.empty(3), torch.empty(2, 2)] for _ in range(size)]
    dist.all_gather_coalesced(lists, [contribution(rank, (3,)), contribution(rank, (2, 2)) + 10])
    for r in range(size):
        same(lists[r][0], contribution(r, (3,)), "all_gather_coalesced [%d][0]" % r)
        same(lists[r][1], contribution(r, (2, 2)) + 10, "all_gather_coalesced [%d][1]" % r)
    for root in range(size):
        gathered = [torch.empty(2, 3) for _ in range(size)] if rank == root else None
        dist.gather(contribution(rank), gathered, dst=root)
        if rank == root:
            for r in range(size):
                same(gathered[r], contribution(r), "gather to %d from %d" % (root, r))
        out = torch.empty(3, dtype=torch.bfloat16)
        pieces = ([contribution(root, (3,), torch.bfloat16) * (r + 1) for r in range(size)]
                  if rank == root else None)
        dist.scatter(out, pieces, src=root)
        same(out, contribution(root, (3,), torch.bfloat16) * (rank + 1), "scatter from %d" % root)
    got = [None] * size
    dist.all_gather_object(got, ("rank", rank, [0] * rank))
    assert got == [("rank", r, [0] * r) for r in range(size)], got


def check_reduce_scatter(rank, size):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PRODUCT):
            def inputs(r):
                return [contribution(r, (4,), dtype) + i for i in range(size)]
            out = torch.empty(4, dtype=dtype)
            dist.reduce_scatter(out, inputs(rank), op=op)
            same(out, fold(op, [inputs(r)[rank] for r in range(size)]),
                 "reduce_scatter %s %s" % (op, dtype))
            out = torch.empty(2, 2, dtype=dtype)
            full = lambda r: contribution(r, (size * 2, 2), dtype)  # noqa: E731
            dist.reduce_scatter_tensor(out, full(rank), op=op)
            same(out, fold(op, [full(r) for r in range(size)])[rank * 2:(rank + 1) * 2],
                 "reduce_scatter_tensor (_reduce_scatter_base) %s %s" % (op, dtype))
    out = torch.empty(4, dtype=torch.float32)
    dist.reduce_scatter(out, [contribution(rank, (4,)) * (i + 1) for i in range(size)],
                        op=ReduceOp.AVG)
    close(out, fold(ReduceOp.AVG, [contribution(r, (4,)) * (rank + 1) for r in range(size)]),
          "reduce_scatter AVG")
    out = torch.empty(4, dtype=torch.int32)
    dist.reduce_scatter(out, [contribution(rank, (4,), torch.int32) + i for i in range(size)],
                        op=ReduceOp.BXOR)
    same(out, fold(ReduceOp.BXOR, [contribution(r, (4,), torch.int32) + rank
                                   for r in range(size)]), "reduce_scatter BXOR")


def check_alltoall(rank, size):
    # all_to_all_single, even: rank r sends rows [2j, 2j+2) of its input to rank j
    def rows(r):
        return (torch.arange(size * 2 * 3, dtype=torch.float32).reshape(size * 2, 3) + 100 * r)
    out = torch.empty(size * 2, 3)
    dist.all_to_all_single(out, rows(rank))
    same(out, torch.cat([rows(r)[2 * rank:2 * rank + 2] for r in range(size)]), "all_to_all_single")
    # uneven: rank r sends j + r + 1 rows to rank j
    def send_splits(r):
        return [j + r + 1 for j in range(size)]
    def uneven(r):
        n = sum(send_splits(r))
        return (torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 1000 * r).to(torch.bfloat16)
    recv_splits = [rank + r + 1 for r in range(size)]
    out = torch.empty(sum(recv_splits), 2, dtype=torch.bfloat16)
    dist.all_to_all_single(out, uneven(rank), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits(rank))
    want = []
    for r in range(size):
        start = sum(send_splits(r)[:rank])
        want.append(uneven(r)[start:start + send_splits(r)[rank]])
    same(out, torch.cat(want), "all_to_all_single with splits")
    # all_to_all of lists, with sizes that differ per pair
    ins = [torch.full((rank + j + 1,), float(10 * rank + j)) for j in range(size)]
    outs = [torch.empty(r + rank + 1) for r in range(size)]
    dist.all_to_all(outs, ins)
    for r in range(size):
        same(outs[r], torch.full((r + rank + 1,), float(10 * r + rank)), "all_to_all from %d" % r)


def check_async(rank, size):
    # More ops of one signature in flight than the backend gives names to at once (8): the later
    # ones wait in the backend's queue for their names, the calls return at once, and every op
    # completes in submission order.
    works, tensors = [], []
    for i in range(20):
        t = contribution(rank, (64,)) * (i + 1)
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    futures = [w.get_future() for w in works]
    for i in reversed(range(20)):
        assert works[i].wait()
        want = fold(ReduceOp.SUM, [contribution(r, (64,)) * (i + 1) for r in range(size)])
        same(tensors[i], want, "async all_reduce %d" % i)
        value = futures[i].wait()
        assert isinstance(value, list) and len(value) == 1, value
        same(value[0], want, "future value %d" % i)
        assert value[0].data_ptr() == tensors[i].data_ptr()
        assert works[i].is_completed()
    # a callback chained on the future runs after completion, with the result
    t = contribution(rank, (4,))
    chained = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(chained.wait(), fold(ReduceOp.SUM, [contribution(r, (4,)) for r in range(size)]) * 2,
         "then()")
    # A callback that submits a collective (as PowerSGD's comm hook does) runs on the backend's
    # thread that completes ops, while this thread has queued more ops of one signature than
    # there are names: neither may wait for the other. Ops are named by call order, so the
    # callback's op must come after the 12 on every rank: it waits until they are queued (their
    # calls return at once), else a fast completion on a late rank would call it in between.
    # An op that has already completed when then() is called (a world of one, a fast rank) has
    # its callback run by torch at once, in this thread: that callback cannot wait for this
    # thread, and submits its op after the 12 from here instead.
    inner = []
    queued = threading.Event()
    ran_inline = []

    def submit_inner():
        t = contribution(rank, (7,))
        inner.append((t, dist.all_reduce(t, async_op=True)))

    def submit_from_callback(fut):
        if threading.current_thread() is threading.main_thread():
            ran_inline.append(True)
            return fut.value()
        assert queued.wait(60), "the 12 all_reduce calls did not return"
        submit_inner()
        return fut.value()

    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(
        submit_from_callback)
    works = [dist.all_reduce(torch.ones(5), async_op=True) for _ in range(12)]
    queued.set()
    if ran_inline:
        submit_inner()
    chained.wait()
    for w in works:
        w.wait()
    inner[0][1].wait()
    same(inner[0][0], fold(ReduceOp.SUM, [contribution(r, (7,)) for r in range(size)]),
         "all_reduce submitted by a callback")
    w = dist.barrier(async_op=True)
    w.wait()
    w = dist.all_gather([torch.empty(1) for _ in range(size)], torch.ones(1), async_op=True)
    assert len(w.get_future().wait()) == size


def check_subgroups(rank, size):
    if size == 1:
        group = dist.new_group([0])
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        same(t, torch.ones(3), "group of one")
        return
    edges = dist.new_group([0, size - 1])
    rest = dist.new_group(list(range(1, size)))
    everyone = dist.new_group()
    members = [0, size - 1]
    if rank in members:
        assert dist.get_world_size(edges) == 2 and dist.get_rank(edges) == members.index(rank)
        t = contribution(rank, dtype=torch.bfloat16)
        dist.all_reduce(t, group=edges)
        same(t, fold(ReduceOp.SUM, [contribution(r, dtype=torch.bfloat16) for r in members]),
             "all_reduce in [0, %d]" % (size - 1))
        t = contribution(rank)
        dist.broadcast(t, src=size - 1, group=edges)  # src is a global rank
        same(t, contribution(size - 1), "broadcast in [0, %d]" % (size - 1))
        outs = [torch.empty(2, 3) for _ in members]
        dist.all_gather(outs, contribution(rank), group=edges)
        for i, r in enumerate(members):
            same(outs[i], contribution(r), "all_gather in group from %d" % r)
        dist.barrier(group=edges)
    else:
        assert edges == dist.GroupMember.NON_GROUP_MEMBER
    if rank >= 1:
        t = contribution(rank, dtype=torch.int64)
        dist.all_reduce(t, op=ReduceOp.MIN, group=rest)
        same(t, fold(ReduceOp.MIN, [contribution(r, dtype=torch.int64) for r in range(1, size)]),
             "all_reduce MIN in [1..%d]" % (size - 1))
    t = contribution(rank)
    dist.all_reduce(t, group=everyone)
    same(t, fold(ReduceOp.SUM, [contribution(r) for r in range(size)]), "new_group() of all")
    # the world group still works after, and its sequence stayed in step
    t = contribution(rank)
    dist.all_reduce(t)
    same(t, fold(ReduceOp.SUM, [contribution(r) for r in range(size)]), "world after subgroups")
    # A group whose last reference goes (here, with the GIL held) while a Python callback of one
    # of its ops has yet to run on the group's thread: the group waits for it, letting go of the
    # GIL. The other ranks come late, so that rank 0's op is still in flight.
    doomed = dist.new_group(list(range(size)))
    if rank > 0:
        time.sleep(0.3)
    t = contribution(rank)

    def slow(fut):
        time.sleep(0.1)
        return fut.value()

    late = dist.all_reduce(t, group=doomed, async_op=True).get_future().then(slow)
    dist.destroy_process_group(doomed)
    del doomed
    assert late.done()
    same(late.wait()[0], fold(ReduceOp.SUM, [contribution(r) for r in range(size)]),
         "callback of a destroyed group")


def main():
    os.environ.setdefault("HORA_TIMEOUT_S", "60")
    dist.init_process_group("hora")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "hora", dist.get_backend()
    pg = dist.group.WORLD
    assert isinstance(pg, hora.distributed.ProcessGroupHora), type(pg)
    assert pg.process_set == 0 and pg.size() == size and pg.rank() == rank
    for check in (check_allreduce, check_reduce_broadcast, check_gathers, check_reduce_scatter,
                  check_alltoall, check_async, check_subgroups):
        check(rank, size)
        print("ok", check.__name__, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print("rank %d of %d: all collectives agree" % (rank, size), flush=True)


if __name__ == "__main__":
    main()
