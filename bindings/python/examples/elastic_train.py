# SPDX-License-Identifier: Apache-2.0
"""Elastic training with hora.torch, Horovod's way: workers may die or join while it runs.

    PYTHONPATH=build/bindings/python tools/horarun -np 3 --min-np 1 --max-np 4 \\
        /usr/bin/python3 bindings/python/examples/elastic_train.py --epochs 5

Kill a worker while it runs (kill -9 on one of the python3 processes): the others roll back to
their last commit, form a smaller world and carry on. With --host-discovery-script, workers that
the script's new slots bring in join at the next commit. A small regression model learns a
synthetic task (no downloads); every worker trains on its share of each batch.
"""

import argparse
import time

import torch

import hora.torch as hvd


def batch(epoch, index, size=64, features=16):
    """The same batch on every worker, whoever is in the world."""
    gen = torch.Generator().manual_seed(epoch * 100003 + index)
    x = torch.randn(size, features, generator=gen)
    w = torch.linspace(-1, 1, features)
    return x, x @ w + 0.1 * torch.randn(size, generator=gen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=50, help="per epoch")
    parser.add_argument("--commit-every", type=int, default=10, help="batches between commits")
    parser.add_argument("--work", type=float, default=0.0, metavar="S",
                        help="seconds of pretend compute per batch (time to kill a worker)")
    args = parser.parse_args()

    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    base_lr = 0.01
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # What survives a change of world: the model, the optimizer, and where the loop was.
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    def on_reset():
        # Horovod's recipe: the learning rate follows the number of workers.
        for group in optimizer.param_groups:
            group["lr"] = base_lr * hvd.size()
        print("rank %d: now %d workers, from epoch %d batch %d" % (
            hvd.rank(), hvd.size(), state.epoch, state.batch), flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            total = 0.0
            while state.batch < args.batches:
                x, y = batch(state.epoch, state.batch)
                mine = slice(hvd.rank(), None, hvd.size())
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[mine]).squeeze(1), y[mine])
                loss.backward()
                optimizer.step()
                total += loss.item()
                time.sleep(args.work)
                state.batch += 1
                if state.batch % args.commit_every == 0:
                    state.commit()  # the point a lost worker rolls back to; joins happen here
            if hvd.rank() == 0:
                print("epoch %d: mean loss %.4f on %d workers" % (
                    state.epoch, total / args.batches, hvd.size()), flush=True)
            state.epoch += 1
            state.batch = 0
            state.commit()

    train(state)
    hvd.shutdown()


if __name__ == "__main__":
    main()
