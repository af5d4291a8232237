# SPDX-License-Identifier: Apache-2.0
"""SyncBatchNorm, as horovod.torch's: batch normalization whose training statistics are those
of the whole batch of every rank of the set. Plain torch operations, so CPU tensors work (Horovod
takes CUDA only); CUDA tensors take the same path (untested here, without a GPU).

Forward: each rank's count, mean and sum of squared deviations per channel are allgathered
and combined in float64, so ranks may have different batch sizes (even none). Backward: the two
per-channel sums the input gradient needs are allreduced. The weight and bias gradients stay
local, as in Horovod: DistributedOptimizer reduces them with the other gradients.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import hora
from hora import global_process_set

from .mpi_ops import Sum, allgather, allreduce_async, synchronize

__all__ = ["SyncBatchNorm"]


def _set_size(process_set):
    if isinstance(process_set, hora.ProcessSet):
        return process_set.size()
    return hora._hora.process_set_size(int(process_set))  # pylint: disable=protected-access


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the ranks of `process_set` (every rank by default) for inputs
    of shape (N, C, ...). Arguments as torch.nn.BatchNorm1d/2d/3d. In training (or whenever
    track_running_stats is False) the mean and variance are those of every rank's batch
    together, and the running statistics are updated with them (unbiased variance), the same
    on every rank; in eval mode the running statistics are used, without communication."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):  # pylint: disable=redefined-builtin
        if input.dim() < 2:
            raise ValueError("hora.torch.SyncBatchNorm: expected an input of at least 2 "
                             "dimensions (N, C, ...), got %dD" % input.dim())

    def forward(self, input):  # pylint: disable=redefined-builtin
        self._check_input_dim(input)
        if input.size(1) != self.num_features:
            raise ValueError("hora.torch.SyncBatchNorm: the input has %d channels, the module %d"
                             % (input.size(1), self.num_features))
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or not self.track_running_stats
        if not batch_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, factor, self.eps)
        if not hora.is_initialized() or _set_size(self.process_set) == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, True, factor, self.eps)
        running = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if running else None,
            self.running_var if running else None, self.eps, factor, self.process_set)


def _work_dtype(x):
    """float64 for float64 inputs, else float32 (half and bfloat16 inputs included)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _channels_last(x):
    """(C, elements per channel) view of an (N, C, ...) tensor."""
    return x.transpose(0, 1).reshape(x.size(1), -1)


def _per_channel(t, x):
    """A (C,) tensor shaped to broadcast against the (N, C, ...) tensor x."""
    return t.reshape([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        work = _work_dtype(x)
        flat = _channels_last(x.detach()).to(work)
        channels, count = flat.shape
        if count:
            mean = flat.mean(dim=1)
            m2 = ((flat - mean.unsqueeze(1)) ** 2).sum(dim=1)
        else:  # a rank with an empty batch still takes part
            mean = m2 = torch.zeros(channels, dtype=work, device=x.device)
        # each rank's count, mean and sum of squared deviations, combined in float64
        mine = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                          mean.double(), m2.double()]).unsqueeze(0)
        every = allgather(mine, process_set=process_set)  # (ranks, 1 + 2C)
        counts = every[:, 0]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError("hora.torch.SyncBatchNorm: expected more than 1 value per channel "
                             "over the ranks in training, got %d" % int(total))
        means, m2s = every[:, 1:1 + channels], every[:, 1 + channels:]
        global_mean = (counts.unsqueeze(1) * means).sum(dim=0) / total
        global_m2 = (m2s + counts.unsqueeze(1) * (means - global_mean) ** 2).sum(dim=0)
        invstd = torch.rsqrt(global_m2 / total + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(
                    global_mean.to(running_mean.dtype) * momentum)
                running_var.mul_(1 - momentum).add_(  # the unbiased variance, as torch's
                    (global_m2 / (total - 1)).to(running_var.dtype) * momentum)

        mean_w, invstd_w = global_mean.to(work), invstd.to(work)
        out = (x.detach().to(work) - _per_channel(mean_w, x)) * _per_channel(invstd_w, x)
        if weight is not None:
            out = out * _per_channel(weight.detach().to(work), x)
        if bias is not None:
            out = out + _per_channel(bias.detach().to(work), x)
        ctx.save_for_backward(x, weight, mean_w, invstd_w)
        ctx.total = total
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean, invstd = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[0:3]
        work = mean.dtype
        dy = grad_output.to(work)
        xhat = (x.to(work) - _per_channel(mean, x)) * _per_channel(invstd, x)
        dims = [0] + list(range(2, x.dim()))
        sum_dy = dy.sum(dim=dims)
        sum_dy_xhat = (dy * xhat).sum(dim=dims)

        grad_input = grad_weight = grad_bias = None
        if need_input:
            # the two sums over every rank's batch (named by call order, the same on every rank)
            handle = allreduce_async(torch.cat([sum_dy, sum_dy_xhat]), op=Sum,
                                     process_set=ctx.process_set)
            sums = synchronize(handle)
            channels = sum_dy.numel()
            mean_dy = _per_channel(sums[:channels] / ctx.total, x)
            mean_dy_xhat = _per_channel(sums[channels:] / ctx.total, x)
            scale = _per_channel(invstd, x)
            if weight is not None:
                scale = scale * _per_channel(weight.detach().to(work), x)
            grad_input = (scale * (dy - mean_dy - xhat * mean_dy_xhat)).to(x.dtype)
        if weight is not None and need_weight:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and need_bias:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else x.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None
