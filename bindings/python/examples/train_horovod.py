# SPDX-License-Identifier: Apache-2.0
"""A Horovod-style PyTorch training script on hora: the only change from Horovod is the import.

    tools/horarun -np 2 /usr/bin/python3 bindings/python/examples/train_horovod.py
    mpirun -np 2 /usr/bin/python3 bindings/python/examples/train_horovod.py

(with PYTHONPATH=<builddir>/bindings/python so that `import hora` finds the build). A small
classifier learns a synthetic task (no downloads); every rank trains on its own shard of each
batch, DistributedOptimizer averages the gradients while backward runs.
"""

import argparse
import time

import torch

import hora.torch as hvd  # was: import horovod.torch as hvd


def synthetic_batches(steps, batch, features, classes, seed=0):
    """The same stream on every rank: points labelled by the nearest of `classes` centres."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 2
    for _ in range(steps):
        x = torch.randn(batch, features, generator=gen) * 1.5
        yield x, torch.cdist(x, centres).argmin(dim=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="gradients travel as float16")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(hvd.rank())  # different on purpose: rank 0's parameters are broadcast
    features, classes = 16, 4
    model = torch.nn.Sequential(
        torch.nn.Linear(features, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, classes))
    # Horovod's recipe: scale the learning rate by the number of ranks
    optimizer = torch.optim.SGD(model.parameters(), lr=0.025 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    loss_fn = torch.nn.CrossEntropyLoss()

    start = time.perf_counter()
    for step, (x, labels) in enumerate(synthetic_batches(args.steps, args.batch * hvd.size(),
                                                         features, classes)):
        shard = slice(hvd.rank() * args.batch, (hvd.rank() + 1) * args.batch)
        x, labels = x[shard], labels[shard]
        optimizer.zero_grad()
        logits = model(x)
        loss = loss_fn(logits, labels)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            # the mean over ranks, as Horovod's examples print it
            mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
            accuracy = hvd.allreduce((logits.argmax(dim=1) == labels).float().mean(),
                                     name="accuracy").item()
            if hvd.rank() == 0:
                print("step %4d  loss %.4f  accuracy %.2f" % (step, mean_loss, accuracy),
                      flush=True)
    elapsed = time.perf_counter() - start

    # Every replica holds the same parameters: rank 0's, broadcast, must equal each rank's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = torch.equal(hvd.broadcast(flat, root_rank=0, name="check"), flat)
    everyone = hvd.allreduce(torch.tensor([int(same)]), op=hvd.Min, name="check.all").item()
    if not everyone:
        raise SystemExit("rank %d: replicas differ after training" % hvd.rank())
    if hvd.rank() == 0:
        print("hora.torch: %d ranks, %d steps in %.2f s; replicas identical"
              % (hvd.size(), args.steps, elapsed), flush=True)


if __name__ == "__main__":
    main()
