# SPDX-License-Identifier: Apache-2.0
"""An elastic hora.torch training run for test_torch_elastic.py (horarun --min-np 1 --max-np 2
--host-discovery-script). Worker slot 1 kills itself in epoch 1: rank 0 carries on alone from
the last commit. Then rank 0 asks for a second slot (it rewrites the file the discovery script
prints), a new worker starts, and both re-form at the next commit and finish together.

Prints, for the test to check:
  RESET size S rank R epoch E batch B loss L committed C   after every re-formed world
  FINAL rank R size S epoch E checksum X                  at the end
and asserts itself that after a reset the model's loss is the loss of the last commit."""

import os
import signal
import sys
import time

import torch

import hora.torch as hvd

EPOCHS, BATCHES, COMMIT_EVERY = 3, 16, 4
FEATURES = 8


def batch_data(epoch, batch):
    gen = torch.Generator().manual_seed(1000 * epoch + batch)
    x = torch.randn(32, FEATURES, generator=gen)
    w = torch.arange(1, FEATURES + 1, dtype=torch.float32) / FEATURES
    return x, x @ w + 0.01 * torch.randn(32, generator=gen)


def main():
    discovery_file = os.environ["ELASTIC_DISCOVERY_FILE"]
    worker = os.environ.get("HORA_ELASTIC_ID", "?")
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # rank 0's parameters win at every sync
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    eval_x, eval_y = batch_data(99, 99)

    def eval_loss():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(eval_x).squeeze(1), eval_y).item()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0, committed_loss=None)
    grown = [False]

    def on_reset():
        loss = eval_loss()
        print("RESET size %d rank %d epoch %d batch %d loss %.9f committed %s" % (
            hvd.size(), hvd.rank(), state.epoch, state.batch, loss, state.committed_loss),
            flush=True)
        if state.committed_loss is not None and abs(loss - state.committed_loss) > 1e-7:
            sys.exit("the model after the reset is not the committed one: loss %.9f, committed "
                     "%.9f" % (loss, state.committed_loss))

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            while state.batch < BATCHES:
                x, y = batch_data(state.epoch, state.batch)
                mine = slice(hvd.rank(), None, hvd.size())
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x[mine]).squeeze(1), y[mine]).backward()
                optimizer.step()
                state.batch += 1
                if worker.endswith("/1") and state.epoch == 1 and state.batch == 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # a lost worker, mid-epoch
                if hvd.size() == 1 and not grown[0] and state.epoch == 1 and state.batch == 12:
                    grown[0] = True
                    with open(discovery_file + ".tmp", "w") as f:
                        f.write("localhost:3\n")
                    os.replace(discovery_file + ".tmp", discovery_file)
                    deadline = time.monotonic() + 60
                    while not hvd.elastic.world_changed() and time.monotonic() < deadline:
                        time.sleep(0.05)
                if state.batch % COMMIT_EVERY == 0:
                    state.committed_loss = eval_loss()
                    state.commit()
            state.epoch += 1
            state.batch = 0
            state.committed_loss = eval_loss()
            state.commit()

    train(state)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print("FINAL rank %d size %d epoch %d checksum %.12f" % (hvd.rank(), hvd.size(), state.epoch,
                                                            checksum), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
