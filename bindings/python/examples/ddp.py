# SPDX-License-Identifier: Apache-2.0
"""Plain PyTorch DistributedDataParallel on the hora backend (or on Gloo, to compare).

    tools/horarun -np 2 /usr/bin/python3 bindings/python/examples/ddp.py --backend hora
    tools/horarun -np 2 /usr/bin/python3 bindings/python/examples/ddp.py --backend gloo
    mpirun -np 2 /usr/bin/python3 bindings/python/examples/ddp.py --backend hora

(with PYTHONPATH=<builddir>/bindings/python so that `import hora` finds the build). torch's
env:// rendezvous needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, which horarun and torchrun
set. Under mpirun the script sets the missing ones itself: RANK and WORLD_SIZE from Open MPI's
OMPI_COMM_WORLD_RANK/SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT=29500 (torch's usual default;
pass another with `mpirun -x MASTER_PORT=...` if that port is taken, and across hosts pass
MASTER_ADDR, rank 0's host, too).

A small classifier learns a synthetic task (no downloads); every rank trains on its own shard of
each batch and DDP averages the gradients. The only hora-specific line is the import.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def env_from_mpirun():
    """torch's env:// variables, where missing, for a rank that Open MPI's mpirun started (see
    the top of this file)."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        return
    os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
    os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def synthetic_batches(steps, batch, features, classes, seed=0):
    """The same stream on every rank: points labelled by the nearest of `classes` centres."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 2
    for _ in range(steps):
        x = torch.randn(batch, features, generator=gen) * 1.5
        labels = torch.cdist(x, centres).argmin(dim=1)
        yield x, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["hora", "gloo"], default="hora")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16 runs on hora only (Gloo has no bfloat16 reductions)")
    args = parser.parse_args()

    env_from_mpirun()
    if args.backend == "hora":
        import hora.distributed  # noqa: F401  registers the "hora" backend
    dist.init_process_group(backend=args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's parameters
    features, classes = 16, 4
    model = torch.nn.Sequential(
        torch.nn.Linear(features, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, classes)).to(dtype)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    start = time.perf_counter()
    for step, (x, labels) in enumerate(synthetic_batches(args.steps, args.batch * size,
                                                         features, classes)):
        shard = slice(rank * args.batch, (rank + 1) * args.batch)
        x, labels = x[shard].to(dtype), labels[shard]
        optimizer.zero_grad()
        logits = model(x)
        loss = loss_fn(logits.float(), labels)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
            print("step %4d  loss %.4f  accuracy %.2f" % (step, loss.item(), accuracy), flush=True)
    elapsed = time.perf_counter() - start

    # Every replica holds the same parameters: check it with one more collective.
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise SystemExit("rank %d: replicas differ after training" % rank)
    if rank == 0:
        print("%s: %d ranks, %d steps in %.2f s; replicas identical"
              % (args.backend, size, args.steps, elapsed), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
