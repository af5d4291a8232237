# SPDX-License-Identifier: Apache-2.0
"""A few training steps under Hugging Face Accelerate on the "hora" backend, at the ranks horarun
(or torchrun) started. Usage: accelerate_worker.py cpu|cuda.

On CUDA Accelerate takes the backend from InitProcessGroupKwargs. On the CPU it accepts only
gloo or mpi and refuses any other name ("Your assigned backend hora is not available, please use
gloo"), so there the process group is created first and Accelerate, finding it initialised, uses
it (its `state.backend` then says gloo, but every collective runs on hora's group)."""

import sys

import torch
import torch.distributed as dist

import hora.distributed  # noqa: F401  registers the "hora" backend
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

import common

device = sys.argv[1]
if device == "cuda":
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="hora")])
else:
    dist.init_process_group("hora")
    accelerator = Accelerator(cpu=True)
assert dist.get_backend() == "hora", dist.get_backend()
rank, size = accelerator.process_index, accelerator.num_processes
assert (rank, size) == (dist.get_rank(), dist.get_world_size())

model = common.make_model()
opt = torch.optim.SGD(model.parameters(), lr=common.LR)
model, opt = accelerator.prepare(model, opt)
x, y = (t.to(accelerator.device) for t in common.batch(rank))
for _ in range(common.STEPS):
    opt.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    opt.step()
common.check(accelerator.unwrap_model(model).state_dict(), size, accelerator.device)
accelerator.wait_for_everyone()
print("accelerate rank %d/%d on %s: parameters match one process on the whole batch"
      % (rank, size, accelerator.device), flush=True)
accelerator.end_training()
