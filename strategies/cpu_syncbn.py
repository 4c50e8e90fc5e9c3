"""SyncBatchNorm for CPU ranks: BatchNorm whose training statistics are the global batch's,
combined across the ranks with torch.distributed (gloo) in the forward and the backward
pass, as ``nn.SyncBatchNorm`` does on GPUs.

torch's ``nn.SyncBatchNorm`` refuses CPU tensors: its kernels (``batch_norm_stats``, the
gather of statistics with counts, the backward reduction) exist only for accelerators. So
every CPU run of several ranks normalises per replica, unlike the same strategy on GPUs,
and the accuracy of N CPU ranks with SyncBN cannot be measured (issue "Does it cost
accuracy", item 4). This module is the math of torch's CUDA path in plain tensor
operations: each rank's mean and biased variance and its element count are exchanged and
merged (Chan's parallel variance, as ``batch_norm_gather_stats_with_counts``), the input
gradient takes the global sums of ``dy`` and ``dy * (x - mean)`` (one exchange), and the
weight and bias gradients stay local, for DDP to average like every other parameter's.
tests/syncbn_shared_check.py holds it to BatchNorm over the whole batch.

The exchange is a gather to the group's first rank and a broadcast of what it gathered, not
gloo's ring all-gather or all-reduce: CPU ranks usually share cores, and a ring step waits
for one particular rank to be scheduled. 8 ranks on 2 cores, 64 float64s: 2.6 ms against
12.6 (all-gather) and 21.4 (all-reduce); with a ResNet-18's 20 BatchNorm layers that was
0.68 s of collectives a step, and the parity workload's SyncBN epoch at N=8 took 49 s
against 6 s with per-replica BatchNorm. Every rank sums the same stack in rank order, so
the merged statistics stay identical on every rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.models.batchnorm import replace_batchnorm


def _channel_view(t: torch.Tensor, dims: int) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over (N, C, ...) of ``dims`` dimensions."""
    return t.view(1, -1, *([1] * (dims - 2)))


def exchange(mine: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's ``mine`` (a 1-D tensor of the same size everywhere), stacked in rank
    order, on every rank of ``group``: gathered by its first rank, then broadcast (two
    steps where a ring takes N-1; the module's docstring has the figures)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    root = 0 if group is None else dist.get_global_rank(group, 0)
    parts = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, parts, dst=root, group=group)
    stacked = torch.stack(parts) if parts is not None else torch.empty(
        world, mine.numel(), dtype=mine.dtype)
    dist.broadcast(stacked, src=root, group=group)
    return stacked


@torch.compiler.disable
def local_statistics(x: torch.Tensor) -> torch.Tensor:
    """This rank's share of the statistics: per-channel mean and biased variance, then its
    element count per channel, in one float64 vector (what ``exchange`` stacks). The
    statistics are never compiled: Inductor's CPU code for this float64 var_mean of a bf16
    input fails ("Welford reduction does not support VectorizedN (N>2)", torch 2.14), which
    ended every ``ddp-amp --cpu-syncbn --compile`` run in its first step."""
    reduce = [0, *range(2, x.dim())]
    var, mean = torch.var_mean(x.detach().double(), dim=reduce, unbiased=False)
    return torch.cat([mean, var, torch.tensor([x.numel() / x.size(1)], dtype=torch.float64)])


@torch.compiler.disable
def merge_statistics(stats: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                  float]:
    """Every rank's ``local_statistics`` (stacked in rank order) merged: the global mean,
    biased variance and element count (Chan's parallel variance)."""
    counts = stats[:, -1:]
    total = counts.sum()
    means, variances = stats[:, :channels], stats[:, channels:2 * channels]
    merged_mean = (counts * means).sum(0) / total
    merged_var = (counts * (variances + (means - merged_mean) ** 2)).sum(0) / total
    return merged_mean, merged_var, float(total)


@torch.compiler.disable  # a collective, then a Python float: graph breaks either way
def global_statistics(x: torch.Tensor, group: Any = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                    float]:
    """The mean and biased variance per channel of the batch all ranks of ``group`` hold
    together, and its element count per channel; accumulated in float64."""
    return merge_statistics(exchange(local_statistics(x), group), x.size(1))


def normalise(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              mean: torch.Tensor, invstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x - mean) * invstd * weight + bias in x's dtype, and x - mean (what the backward
    keeps). A low-precision x (bf16 or fp16: autocast hands BatchNorm a convolution's
    output) is normalised in float32 and rounded once, as torch's BatchNorm and its CUDA
    SyncBatchNorm do; the statistics rounded to bf16 first moved outputs by up to 2^-9 of
    the mean."""
    dims = x.dim()
    work = torch.promote_types(x.dtype, torch.float32)
    m, s = _channel_view(mean.to(work), dims), _channel_view(invstd.to(work), dims)
    centred = x.to(work) - m
    scale = s if weight is None else s * _channel_view(weight.to(work), dims)
    out = centred * scale
    if bias is not None:
        out = out + _channel_view(bias.to(work), dims)
    return out.to(x.dtype), centred


def local_gradient_sums(grad_out: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
    """This rank's per-channel sums of dy and dy * (x - mean), in one float64 vector (what
    the backward exchanges)."""
    reduce = [0, *range(2, centred.dim())]
    grad_out = grad_out.to(centred.dtype)
    return torch.cat([grad_out.sum(reduce).double(), (grad_out * centred).sum(reduce).double()])


def normalise_backward(grad_out: torch.Tensor, centred: torch.Tensor, mine: torch.Tensor,
                       both: torch.Tensor, total: float, weight: torch.Tensor | None,
                       invstd: torch.Tensor, dtype: torch.dtype):
    """The input gradient (in ``dtype``, the input's), from this rank's gradient sums
    ``mine`` and every rank's summed (``both``); the weight and bias gradients of this
    rank's share, left for DDP to average like every other parameter's (None without
    them: ``affine=False``)."""
    dims, work = centred.dim(), centred.dtype
    channels = mine.numel() // 2
    sum_dy, sum_dy_xmu = mine[:channels], mine[channels:]
    # BatchNorm's affine flag gives it both a weight and a bias, or neither
    affine = weight is not None
    grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if affine else None
    grad_bias = sum_dy.to(weight.dtype) if affine else None
    mean_dy = both[:channels] / total
    mean_dy_xmu = both[channels:] / total
    scale = invstd if weight is None else invstd * weight.double()
    grad_x = (grad_out.to(work) - _channel_view(mean_dy.to(work), dims)
              - centred * _channel_view((invstd ** 2 * mean_dy_xmu).to(work), dims)
              ) * _channel_view(scale.to(work), dims)
    return grad_x.to(dtype), grad_weight, grad_bias


class _Normalise(torch.autograd.Function):
    """``normalise`` with the global mean and invstd; the backward pass exchanges the two
    per-channel sums the input gradient needs."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, total, group):
        out, centred = normalise(x, weight, bias, mean, invstd)
        ctx.save_for_backward(centred, weight, invstd)
        ctx.total, ctx.group, ctx.dtype = total, group, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        centred, weight, invstd = ctx.saved_tensors
        mine = local_gradient_sums(grad_out, centred)
        both = exchange(mine, ctx.group).sum(0)
        grad_x, grad_weight, grad_bias = normalise_backward(
            grad_out, centred, mine, both, ctx.total, weight, invstd, ctx.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the global batch of the default process group's ranks (or
    ``process_group``'s) in training; the running statistics, evaluation and a lone rank
    are plain BatchNorm's."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        synchronised = (self.training and dist.is_available() and dist.is_initialized()
                        and dist.get_world_size(self.process_group) > 1)
        if not synchronised:
            return super().forward(x)
        mean, var, total = global_statistics(x, self.process_group)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                          else self.momentum)
                unbiased = var * total / max(total - 1, 1)
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype),
                                                        alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype),
                                                       alpha=factor)
        invstd = torch.rsqrt(var + self.eps)
        return _Normalise.apply(x, self.weight, self.bias, mean, invstd, total,
                                self.process_group)

    @classmethod
    def convert(cls, module: nn.Module, process_group: Any = None) -> nn.Module:
        """``module`` with every BatchNorm layer replaced by this one, its parameters and
        running statistics kept (``nn.SyncBatchNorm.convert_sync_batchnorm``'s CPU twin)."""
        return replace_batchnorm(module, lambda bn: cls(
            bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
            process_group), cls)
