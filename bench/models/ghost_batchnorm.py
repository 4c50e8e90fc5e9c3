"""Ghost BatchNorm (``--ghost-bn G``; Hoffer, Hubara and Soudry 2017): in training,
BatchNorm's statistics over each group of G images of a replica's batch, in one forward.

It is what per-replica BatchNorm computes on a replica that holds G images, and what
``--grad-accum`` computes with micro-batches of G: the same normalisation, the same gradient
(the loss is the batch's mean either way), and here the same running statistics, updated
group after group as G-image micro-batches would update them. One forward over the whole
batch instead of batch/G small ones: the parity self-test's planted cost (BatchNorm over 2)
took a step of 64 micro-batches of 2 before (docs/parity.md). Evaluation is plain
BatchNorm's, over the running statistics."""

from __future__ import annotations

import torch
from torch import nn

from bench.models.batchnorm import replace_batchnorm


class GhostBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are each ``group`` consecutive samples' own (the
    batch must split into whole groups); a batch of one group is plain BatchNorm."""

    def __init__(self, num_features: int, group: int, eps: float = 1e-5,
                 momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        if group < 1:
            raise ValueError(f"a ghost BatchNorm group holds at least 1 sample (got {group})")
        self.group = group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group={self.group}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        n = x.shape[0]
        if not self.training or n == self.group:
            return super().forward(x)
        if n % self.group:
            raise ValueError(f"ghost BatchNorm: a batch of {n} does not split into groups of "
                             f"{self.group}")
        groups = n // self.group
        # statistics in float32 at least (as torch's BatchNorm keeps them under autocast)
        work = torch.promote_types(x.dtype, torch.float32)
        grouped = x.to(work).reshape(groups, self.group, *x.shape[1:])
        dims = (1, *range(3, grouped.dim()))
        var, mean = torch.var_mean(grouped, dim=dims, unbiased=False, keepdim=True)
        y = (grouped - mean) * torch.rsqrt(var + self.eps)
        shape = (1, 1, -1) + (1,) * (grouped.dim() - 3)
        if self.affine:
            y = y * self.weight.to(work).view(shape) + self.bias.to(work).view(shape)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running(mean.flatten(1), var.flatten(1), grouped[0].numel() //
                                 x.shape[1])
        return y.reshape(x.shape).to(x.dtype).contiguous(
            memory_format=_memory_format(x))

    @torch.no_grad()
    def _update_running(self, means: torch.Tensor, variances: torch.Tensor, count: int) -> None:
        """The running statistics after one update per group, in order: what ``groups``
        micro-batches of ``group`` samples leave (unbiased variance, as BatchNorm keeps)."""
        unbiased = variances * count / max(count - 1, 1)
        groups = means.shape[0]
        if self.momentum is None:  # cumulative average: one update at a time
            for i in range(groups):
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - factor).add_(means[i].to(self.running_mean.dtype),
                                                        alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased[i].to(self.running_var.dtype),
                                                       alpha=factor)
            return
        self.num_batches_tracked.add_(groups)
        m = self.momentum
        # r_k = (1 - m)^k r_0 + sum_j m (1 - m)^(k - j) s_j, j = 1..k
        weights = m * (1 - m) ** torch.arange(groups - 1, -1, -1, dtype=means.dtype,
                                              device=means.device)
        for running, stats in ((self.running_mean, means), (self.running_var, unbiased)):
            running.mul_((1 - m) ** groups).add_(
                (weights[:, None] * stats).sum(0).to(running.dtype))

    @classmethod
    def convert(cls, module: nn.Module, group: int) -> nn.Module:
        """``module`` with every BatchNorm layer replaced by a ghost one over ``group``
        samples, its parameters and running statistics kept."""
        return replace_batchnorm(module, lambda bn: cls(
            bn.num_features, group, bn.eps, bn.momentum, bn.affine, bn.track_running_stats),
            cls)


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """The layout to hand back: the input's (channels_last in, channels_last out)."""
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not (
            x.is_contiguous()):
        return torch.channels_last
    return torch.contiguous_format
