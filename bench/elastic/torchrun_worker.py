# SPDX-License-Identifier: Apache-2.0
"""The torchrun side of bench/elastic/recovery.py: torch.distributed on Gloo, started by
torchrun --max-restarts 1. The same job as hora's restart_prog.c: allreduces of 4096 doubles;
rank 1 kills itself at step 5 in the first round ("KILLED_AT t" on stderr); after the restart,
rank 0 prints "RESUMED_AT t" once its first allreduce is done."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    x = torch.zeros(4096, dtype=torch.float64)
    for step in range(10):
        if restart == 0 and rank == 1 and step == 5:
            sys.stderr.write("KILLED_AT %.6f\n" % time.time())
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        x.fill_(float((rank + 1) * (step + 1)))
        dist.all_reduce(x)
        want = size * (size + 1) / 2 * (step + 1)
        if x[0].item() != want:
            sys.exit("rank %d step %d: %g, want %g" % (rank, step, x[0].item(), want))
        if restart > 0 and rank == 0 and step == 0:
            print("RESUMED_AT %.6f" % time.time(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
