# SPDX-License-Identifier: Apache-2.0
"""One rank of an unmodified DistributedDataParallel training loop, on backend hora or gloo.

Writes its final parameters to OUT/params_<backend>_<dtype>[-<hook>]_<rank>.pt, after checking them
against the same model trained in this process alone on the whole batch (what DDP's averaged
gradients amount to). test_ddp.py compares the files across ranks and backends."""

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

BATCH = 6  # per rank
STEPS = 10


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 32)
        self.out = torch.nn.Linear(32, 4)
        self.spare = torch.nn.Linear(32, 4)  # used on even steps only (find_unused_parameters)

    def forward(self, x, step=0):
        h = torch.tanh(self.hidden(x))
        y = self.out(h)
        return y + self.spare(h) if step % 2 == 0 else y


def batches(size, dtype):
    """The whole batch of every step, the same on every rank: a fresh draw each step of inputs
    whose targets come from one fixed function, so that the loss falls."""
    gen = torch.Generator().manual_seed(1234)
    teacher = torch.randn(8, 4, generator=gen)
    for _ in range(STEPS):
        x = torch.randn(size * BATCH, 8, generator=gen)
        yield x.to(dtype), torch.tanh(x @ teacher).to(dtype)


def train(model, size, rank, dtype, shard):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step, (x, y) in enumerate(batches(size, dtype)):
        if shard:
            x, y = x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]
        opt.zero_grad()
        loss = ((model(x, step) - y) ** 2).mean()  # mse_loss has no CPU bfloat16 kernel
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bfloat16_average_hook(group, bucket):
    """Averages the bucket in bfloat16; the decompression runs as a Python callback of hora's
    future, on the backend's watcher thread."""
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size())
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(decompress)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["hora", "gloo"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--hook", choices=["none", "bf16"], default="none",
                        help="bf16: gradients averaged in bfloat16 by a comm hook (DDP's own "
                             "bf16_compress_hook insists on NCCL, by its name)")
    args = parser.parse_args()
    os.environ.setdefault("HORA_TIMEOUT_S", "60")
    warnings.filterwarnings("ignore", message=".*find_unused_parameters=True.*")
    # Registers the hora backend; under a plain mpirun it also gives torch its env:// variables,
    # which the gloo run needs too.
    import hora.distributed  # noqa: F401
    dtype = getattr(torch, args.dtype)

    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # DDP's first broadcast must make the replicas equal
    model = Net().to(dtype)
    # Small buckets: several allreduces in flight per step, completed out of order by hora.
    ddp = DDP(model, bucket_cap_mb=0.002, find_unused_parameters=True)
    if args.hook == "bf16":
        ddp.register_comm_hook(None, bfloat16_average_hook)
    losses = train(ddp, size, rank, dtype, shard=True)
    dist.barrier()

    torch.manual_seed(0)  # rank 0's initial parameters, which DDP broadcast to every replica
    alone = Net().to(dtype)
    train(alone, size, rank, dtype, shard=False)
    tol = 1e-4 if dtype == torch.float32 and args.hook == "none" else 5e-2
    for (name, p), q in zip(model.named_parameters(), alone.parameters()):
        if not torch.allclose(p.double(), q.double(), rtol=tol, atol=tol):
            raise AssertionError("rank %d: %s differs from training alone on the whole batch by %g"
                                 % (rank, name, (p.double() - q.double()).abs().max()))
    assert losses[-1] < losses[0], losses
    tag = args.dtype if args.hook == "none" else args.dtype + "-" + args.hook
    path = os.path.join(args.out, "params_%s_%s_%d.pt" % (args.backend, tag, rank))
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, path)
    dist.destroy_process_group()
    print("rank %d: DDP on %s (%s) trained, loss %.4f -> %.4f; matches one process"
          % (rank, args.backend, args.dtype, losses[0], losses[-1]), flush=True)


if __name__ == "__main__":
    main()
