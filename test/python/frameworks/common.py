# SPDX-License-Identifier: Apache-2.0
"""What the framework workers share: each rank's own batch, and the parameters one process
reaches training on every rank's batch at once (what data-parallel SGD must reproduce)."""

import torch

FEATURES, OUTPUTS, BATCH, STEPS, LR = 8, 4, 16, 3, 0.1


def make_model():
    torch.manual_seed(0)  # the same start on every rank, and in the reference
    return torch.nn.Linear(FEATURES, OUTPUTS)


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, OUTPUTS, generator=g)


def reference(world_size):
    """One process, the whole batch: gradients of the mean loss over every rank's samples are the
    mean of the ranks' gradients, which is what DDP's averaging computes."""
    model = make_model()
    xs, ys = zip(*(batch(r) for r in range(world_size)))
    x, y = torch.cat(xs), torch.cat(ys)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check(params, world_size, device):
    """Every parameter equals the reference's; raises with the largest difference otherwise."""
    want = reference(world_size)
    for name, value in params.items():
        got = value.detach().to("cpu").float()
        if not torch.allclose(got, want[name], rtol=1e-4, atol=1e-5):
            raise AssertionError("%s on %s differs from one process on the whole batch by %g"
                                 % (name, device, (got - want[name]).abs().max()))
