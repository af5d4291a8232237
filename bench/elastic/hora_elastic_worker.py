# SPDX-License-Identifier: Apache-2.0
"""The hora.torch elastic side of bench/elastic/recovery.py: a model's gradients averaged by
hora.torch's DistributedOptimizer, state committed every step (hora.torch.elastic.TorchState).
Worker slot 1 kills itself at step 5 ("KILLED_AT t" on stderr); the survivors restore the last
commit and form a smaller world, and rank 0 prints "RESUMED_AT t" once its first step there is
done."""

import os
import signal
import sys
import time

import torch

import hora.torch as hvd


def main():
    hvd.init()
    model = torch.nn.Linear(64, 64)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    victim = os.environ.get("HORA_ELASTIC_ID", "").endswith("/1")
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        reported = False
        while state.step < 10:
            if victim and state.step == 5:
                sys.stderr.write("KILLED_AT %.6f\n" % time.time())
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            model(torch.ones(8, 64)).sum().backward()
            optimizer.step()
            state.step += 1
            if resets and not reported and hvd.rank() == 0:
                print("RESUMED_AT %.6f" % time.time(), flush=True)
                reported = True
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
