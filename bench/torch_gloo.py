# SPDX-License-Identifier: Apache-2.0
"""hora against torch.distributed's own Gloo: blocking float32 allreduce, 4 B to 64 MiB, one run.

    PYTHONPATH=build/bindings/python tools/horarun -np 2 /usr/bin/python3 bench/torch_gloo.py

Every rank runs this with torchrun-style variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
as tools/horarun or torchrun set them). hora forms its world on MASTER_PORT; torch's Gloo process
group rendezvouses on a port that rank 0 finds free and hora broadcasts (MASTER_PORT + 1 without
hora; --torch-port to choose). For each size, the two run in
alternating blocks of blocking ops on the same tensor (half the iterations each time, twice), so
that a noisy neighbour on the machine hits both alike. Each op is timed alone; an op's time is the
slowest rank's, and the table gives the median and the mean over the ops, and hora / torch (below
1: hora is faster).

--plane picks hora's CPU plane (HORA_CPU_BACKEND: gloo, ucx, mpi, auto); on one host hora would
reduce through shared memory, so --shm off (the default here) sends allreduce through the plane.
"""

import argparse
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", type=int, default=4, help="smallest size in bytes (4)")
    p.add_argument("-e", "--maxbytes", type=int, default=64 << 20,
                   help="largest size in bytes (64 MiB)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier (4)")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help="timed ops per size and library (default: from 200 at small sizes "
                        "down to 10 at 64 MiB)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed ops first (5)")
    p.add_argument("--plane", default=os.environ.get("HORA_CPU_BACKEND", "gloo"),
                   help="hora's CPU plane, HORA_CPU_BACKEND (default gloo)")
    p.add_argument("--shm", default="off",
                   help="HORA_SHM for hora (default off, so that one host measures the plane)")
    p.add_argument("--torch-port", type=int, default=0, help="torch's TCP store port "
                   "(default: a free one on rank 0)")
    p.add_argument("--only", choices=("both", "hora", "torch"), default="both")
    return p.parse_args()


def iters_for(nbytes, asked):
    if asked:
        return asked
    # about 10-20 ms of traffic at torch's rate, 10 ops at least, 200 at most
    return int(max(10, min(200, (32 << 20) // max(nbytes, 1))))


def main():
    args = parse_args()
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        if name not in os.environ:
            sys.exit("torch_gloo.py: %s is not set (start it with tools/horarun -np N or torchrun)"
                     % name)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    os.environ["HORA_CPU_BACKEND"] = args.plane
    os.environ["HORA_SHM"] = args.shm
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)

    use_hora = args.only in ("both", "hora")
    use_torch = args.only in ("both", "torch")
    hvd = None
    if use_hora:
        import hora.torch as hvd
        hvd.init()
        assert hvd.rank() == rank and hvd.size() == world
    port = args.torch_port
    if not port and hvd is not None:
        # a port that is free on rank 0 now, told to every rank through hora itself
        import socket
        pick = torch.zeros(1, dtype=torch.int64)
        if rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                pick[0] = s.getsockname()[1]
        port = int(hvd.broadcast(pick, 0, name="torch_gloo.port")[0])
    port = port or int(os.environ["MASTER_PORT"]) + 1
    # torch's store always carries the results table's timings, so it starts either way
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (os.environ["MASTER_ADDR"], port),
                            rank=rank, world_size=world)

    def torch_op(t, name):
        dist.all_reduce(t)

    def hora_op(t, name):
        hvd.allreduce_(t, name=name, op=hvd.Sum)

    libs = []
    if use_hora:
        libs.append(("hora", hora_op))
    if use_torch:
        libs.append(("torch", torch_op))

    sizes = []
    n = max(4, args.minbytes)
    while n <= args.maxbytes:
        sizes.append(n)
        n *= args.stepfactor

    if rank == 0:
        import socket
        print("# torch_gloo.py: blocking allreduce, float32 sum, %d ranks on %s; torch %s (gloo); "
              "hora on HORA_CPU_BACKEND=%s HORA_SHM=%s" % (world, socket.gethostname(),
                                                           torch.__version__, args.plane, args.shm))
        print("# time: the slowest rank's time of each op; median and mean over the ops "
              "(us); ratio: hora / torch")
        head = "#%11s %10s %6s" % ("size", "count", "iters")
        for lib, _ in libs:
            head += " %12s %12s" % (lib + " med", lib + " mean")
        if len(libs) == 2:
            head += " %9s %9s %7s" % ("med ratio", "mean ratio", "#wrong")
        print(head)
        print("#%11s %10s %6s" % ("(B)", "(elems)", "") + " %12s %12s" % ("(us)", "(us)") * len(libs))
        sys.stdout.flush()

    worst = {"med": 0.0, "mean": 0.0}
    for nbytes in sizes:
        count = nbytes // 4
        iters = iters_for(nbytes, args.iters)
        t = torch.zeros(count, dtype=torch.float32)
        name = "torch_gloo.%d" % nbytes
        # correctness once per size and library: sum over ranks of (rank + 1)
        wrong = 0
        expected = world * (world + 1) / 2.0
        for _, op in libs:
            t.fill_(rank + 1.0)
            op(t, name)
            wrong += int((t != expected).sum().item())
        t.zero_()  # zeros stay zeros: the timed ops reduce the same values over and over
        times = {lib: [] for lib, _ in libs}
        for _, op in libs:
            for _ in range(args.warmup):
                op(t, name)
        # alternate blocks: A B A B, half the ops each
        halves = [iters // 2, iters - iters // 2]
        for half in halves:
            for lib, op in libs:
                dist.barrier()
                mine = times[lib]
                for _ in range(half):
                    start = time.perf_counter()
                    op(t, name)
                    mine.append((time.perf_counter() - start) * 1e6)
        # the slowest rank's time of each op, and the wrong elements of every rank
        local = []
        for lib, _ in libs:
            local += times[lib]
        local.append(float(wrong))
        mine = torch.tensor(local, dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        slowest = torch.stack(gathered).max(dim=0).values.tolist()
        wrong = int(sum(g[-1].item() for g in gathered))
        if rank == 0:
            line = "%12d %10d %6d" % (nbytes, count, iters)
            stats = {}
            at = 0
            for lib, _ in libs:
                ops = slowest[at:at + iters]
                at += iters
                stats[lib] = (statistics.median(ops), statistics.fmean(ops))
                line += " %12.1f %12.1f" % stats[lib]
            if len(libs) == 2:
                med = stats["hora"][0] / stats["torch"][0]
                mean = stats["hora"][1] / stats["torch"][1]
                worst["med"] = max(worst["med"], med)
                worst["mean"] = max(worst["mean"], mean)
                line += " %9.3f %9.3f %7d" % (med, mean, wrong)
            print(line)
            sys.stdout.flush()
    if rank == 0 and len(libs) == 2:
        print("# worst hora / torch: median %.3f, mean %.3f" % (worst["med"], worst["mean"]))
    dist.barrier()
    dist.destroy_process_group()
    if hvd is not None:
        hvd.shutdown()


if __name__ == "__main__":
    main()
