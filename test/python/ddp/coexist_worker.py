# SPDX-License-Identifier: Apache-2.0
"""One rank of the coexistence test: hora's Horovod face (hora.torch) and a torch.distributed
group in one process, started in the order ORDER names (argv[1]):

    hvd-hora   hvd.init(), then init_process_group("hora")
    hora-hvd   init_process_group("hora"), then hvd.init()
    hvd-gloo   hvd.init(), then init_process_group("gloo")
    gloo-hvd   init_process_group("gloo"), then hvd.init()

Then an allreduce on each face, checked against the sum computed here. Started by
test_coexist.py with torchrun's variables, under mpirun, or with Slurm's variables only.
argv[2] "late": hora.distributed is imported only after hvd.init() (orders starting with hvd)."""

import importlib
import os
import sys

import torch
import torch.distributed as dist

import hora.torch as hvd


def main():
    order = sys.argv[1]
    # "late": import hora.distributed (which registers "hora" and, under mpirun or srun, fills
    # torch's env:// variables) after hvd.init(), as a script that imports it lazily does
    late = len(sys.argv) > 2 and sys.argv[2] == "late"
    if not late:
        importlib.import_module("hora.distributed")
    first, second = order.split("-")
    for step in (first, second):
        if step == "hvd":
            hvd.init()
            if late:
                importlib.import_module("hora.distributed")
        else:
            dist.init_process_group(step)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert (hvd.rank(), hvd.size()) == (rank, size), (hvd.rank(), hvd.size(), rank, size)
    if os.environ.get("SLURM_LOCALID"):  # under srun: hora's and torch's local rank are Slurm's
        assert hvd.local_rank() == int(os.environ["SLURM_LOCALID"]) == int(os.environ["LOCAL_RANK"])
    expected = torch.full((5,), float(size * (size + 1) // 2)) + torch.arange(5.0) * size

    mine = torch.arange(5.0) + rank + 1
    by_hora = hvd.allreduce(mine, op=hvd.Sum, name="coexist")
    by_torch = mine.clone()
    dist.all_reduce(by_torch)
    assert torch.equal(by_hora, expected), (by_hora, expected)
    assert torch.equal(by_torch, expected), (by_torch, expected)
    # and hora again after torch's op: both stay usable
    assert torch.equal(hvd.allreduce(mine, op=hvd.Sum, name="coexist.2"), expected)
    print("rank %d of %d: %s agree" % (rank, size, order), flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
