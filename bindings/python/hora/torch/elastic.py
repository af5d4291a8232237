# SPDX-License-Identifier: Apache-2.0
"""hora.torch.elastic: horovod.torch.elastic's names. TorchState keeps a model, an optimizer and
any picklable extras across a change of world (see hora.elastic)."""

import copy

from hora.elastic import (HostsUpdatedInterrupt, ObjectState, State, is_elastic, run,  # noqa: F401
                          world_changed)

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from hora import rank

__all__ = ["run", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt", "world_changed",
           "is_elastic"]


class TorchState(ObjectState):
    """TorchState(model, optimizer, epoch=0, batch=0): commit() copies the model's and the
    optimizer's state_dict (in memory) and the extras; restore() loads them back; sync()
    broadcasts rank 0's parameters, optimizer state and extras to every rank."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._saved_model = None
        self._saved_optimizer = None
        super().__init__(bcast_object=lambda obj, root: broadcast_object(obj, root),
                         get_rank=rank, **kwargs)
        self.save()

    def save(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        super().save()

    def restore(self):
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()
        self.save()
