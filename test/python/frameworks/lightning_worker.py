# SPDX-License-Identifier: Apache-2.0
"""A few training steps under PyTorch Lightning's DDP strategy on the "hora" backend, at the
ranks horarun (or torchrun) started. Usage: lightning_worker.py cpu|cuda.

Lightning sees LOCAL_RANK and so takes the processes as started for it; `devices` must be the
number of ranks on this host and `num_nodes` the number of hosts."""

import os
import sys

import torch
import torch.distributed as dist

import hora.distributed  # noqa: F401  registers the "hora" backend

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the older package name
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

import common


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = common.make_model()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=common.LR)


device = sys.argv[1]
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
data = torch.utils.data.TensorDataset(*common.batch(rank))
loader = torch.utils.data.DataLoader(data, batch_size=common.BATCH)  # one batch per epoch
module = Module()
trainer = pl.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=local_size,
                     num_nodes=size // local_size,
                     strategy=DDPStrategy(process_group_backend="hora"),
                     max_steps=common.STEPS, use_distributed_sampler=False, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(module, loader)
assert dist.get_backend() == "hora", dist.get_backend()
common.check({"weight": module.net.weight, "bias": module.net.bias}, size, device)
print("lightning rank %d/%d on %s: parameters match one process on the whole batch"
      % (rank, size, device), flush=True)
