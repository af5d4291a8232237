# SPDX-License-Identifier: Apache-2.0
"""One rank of DistributedDataParallel on CUDA tensors, on backend hora (hora's NCCL path) or
nccl (torch's own), one GPU per rank (LOCAL_RANK's).

Writes its final parameters to OUT/params_cuda_<backend>_<rank>.pt; test_ddp_cuda.py compares
hora's with nccl's bit for bit. On hora it first checks the backend's CUDA semantics: Work.wait()
orders torch's current stream (the default one and another) after the op, the future's value is
the result, an allgather (whose results the backend copies out of hora's output) is right, and
an op given CPU and CUDA tensors at once fails naming the op, the tensor and both devices."""

import argparse
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# cuBLAS picks the same kernels in both runs only in its deterministic mode; set before torch
# touches CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_worker import BATCH, STEPS, Net, batches  # noqa: E402


def check_cuda_semantics(device, rank, size):
    """What the hora backend promises for CUDA tensors beyond DDP (docs/torch-errors.md)."""
    import hora  # pylint: disable=import-outside-toplevel
    total = float(size * (size + 1) // 2)
    n = 1 << 20  # large enough that the reduction is still running when wait() returns
    # Work.wait() is stream-ordered: work queued on the current stream afterwards sees the result.
    x = torch.full((n,), float(rank + 1), device=device)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    y = x * 2
    torch.cuda.synchronize(device)
    assert torch.equal(y, torch.full_like(y, 2 * total)), "stream-ordered wait on the default stream"
    # ... on another current stream too: the op waits for that stream's earlier work (the fill),
    # and that stream waits for the op.
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        z = torch.empty(n, device=device)
        z.fill_(float(rank + 1))
        work = dist.all_reduce(z, async_op=True)
        work.wait()
        w = z + 1
    side.synchronize()
    assert torch.equal(w, torch.full_like(w, total + 1)), "stream-ordered wait on a side stream"
    # The future completes with the result on the device.
    f = torch.full((1000,), float(rank + 1), device=device)
    value = dist.all_reduce(f, async_op=True).get_future().wait()[0]
    assert torch.equal(value.cpu(), torch.full((1000,), total)), "the future's value"
    # allgather: the backend copies hora's output into the outputs, then the work completes.
    outs = [torch.empty(5, device=device) for _ in range(size)]
    dist.all_gather(outs, torch.arange(5, device=device, dtype=torch.float32) + 10 * rank)
    for r, o in enumerate(outs):
        assert torch.equal(o.cpu(), torch.arange(5, dtype=torch.float32) + 10 * r), "allgather"
    # One op, two devices.
    try:
        dist.all_gather([torch.empty(5) for _ in range(size)], torch.zeros(5, device=device))
    except RuntimeError as e:
        text = str(e)
        for word in ("allgather", "output 0", "cpu", str(device)):
            assert word in text, "%r does not mention %r" % (text, word)
        assert isinstance(e, hora.InvalidArgumentError), type(e)
    else:
        raise AssertionError("allgather of CPU outputs and a CUDA input did not fail")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["hora", "nccl"], required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("HORA_TIMEOUT_S", "60")
    warnings.filterwarnings("ignore", message=".*find_unused_parameters=True.*")
    import hora.distributed  # noqa: F401  (registers "hora")
    torch.use_deterministic_algorithms(True, warn_only=True)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)

    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.backend == "hora":
        check_cuda_semantics(device, rank, size)
    torch.manual_seed(rank)  # DDP's first broadcast must make the replicas equal
    model = Net().to(device)
    # Small buckets: several allreduces per step; the spare layer makes DDP allreduce its
    # used-parameter map too.
    ddp = DDP(model, device_ids=[device], bucket_cap_mb=0.002, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step, (x, y) in enumerate(batches(size, torch.float32)):
        x = x[rank * BATCH:(rank + 1) * BATCH].to(device)
        y = y[rank * BATCH:(rank + 1) * BATCH].to(device)
        opt.zero_grad()
        loss = ((ddp(x, step) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    dist.barrier()
    path = os.path.join(args.out, "params_cuda_%s_%d.pt" % (args.backend, rank))
    torch.save({n: p.detach().cpu().clone() for n, p in model.named_parameters()}, path)
    dist.destroy_process_group()
    print("rank %d: DDP on %s (%s) trained, loss %.4f -> %.4f"
          % (rank, args.backend, device, losses[0], losses[-1]), flush=True)


if __name__ == "__main__":
    main()
