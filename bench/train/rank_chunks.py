"""The reference of a mixed-precision CPU run under SyncBN, in one process but cut as its
ranks cut it: ``bench verify``'s plain loop for ``ddp-amp --cpu --cpu-syncbn``.

Why. Under bf16 every activation is rounded, so two computations of the same function
differ wherever one rounds a value the other carries a unit further: a 1-ulp float32
difference flips a bf16 rounding now and then, and a whole-batch reference rounded the
convolutions' weight gradients once where each rank rounds its own share. Over 10 steps
such a reference and ``ddp-amp --cpu-syncbn`` differed by 2-3e-4 (loss) and 7-10e-5
(parameters), growing with the steps, where the smallest defect the self-test injects moves
the parameters by 1.3e-4: the check failed a correct strategy and could not tell a defect.
Per-replica BatchNorm has no such noise (its reference runs each replica's forward pass).

What. Here every convolution (any dimension, transposed too) and linear layer runs once
per rank chunk (autocast's weight cache off, so that each chunk's bf16 weight gradient is
rounded alone and summed in float32, as DDP sums the ranks'; a weight used through a
function, as attention's in-projection is, is not cut), and BatchNorm is
strategies/cpu_syncbn.py's arithmetic with the exchange replaced by stacking the chunks'
shares in rank order. The float64 check
of ``ddp --cpu-syncbn`` (BatchNorm over the whole batch, torch's own) and
tests/syncbn_shared_check.py hold that arithmetic to the math; this reference holds the
mixed-precision path around it (autocast, DDP's all-reduce, the loop) to the same numbers.
GPU runs use torch's SyncBatchNorm, whose kernels this does not reproduce: their reference
stays torch's BatchNorm over the whole batch."""

from __future__ import annotations

import functools

import torch
from torch import nn

from bench.models.batchnorm import replace_batchnorm
from strategies.cpu_syncbn import (
    local_gradient_sums,
    local_statistics,
    merge_statistics,
    normalise,
    normalise_backward,
)


class _ChunkedNormalise(torch.autograd.Function):
    """SyncBN over ``chunks`` rank shares of ``x``: each share's statistics and gradient
    sums computed alone and stacked in rank order, as the ranks exchange them; each share
    normalised alone. The weight and bias gradients are the shares' summed in rank order."""

    @staticmethod
    def forward(ctx, x, weight, bias, chunks, eps):
        parts = x.chunk(chunks)
        stats = torch.stack([local_statistics(part) for part in parts])
        mean, var, total = merge_statistics(stats, x.size(1))
        invstd = torch.rsqrt(var + eps)
        outs, centred = zip(*(normalise(part, weight, bias, mean, invstd) for part in parts))
        ctx.save_for_backward(*centred, weight, invstd)
        ctx.total, ctx.dtype = total, x.dtype
        return torch.cat(outs)

    @staticmethod
    def backward(ctx, grad_out):
        *centred, weight, invstd = ctx.saved_tensors
        grads = grad_out.chunk(len(centred))
        mine = [local_gradient_sums(g, c) for g, c in zip(grads, centred)]
        both = torch.stack(mine).sum(0)
        shares = [normalise_backward(g, c, m, both, ctx.total, weight, invstd, ctx.dtype)
                  for g, c, m in zip(grads, centred, mine)]
        grad_x = torch.cat([share[0] for share in shares])
        if weight is None:  # affine=False: no weight, no bias
            return grad_x, None, None, None, None
        grad_weight = functools.reduce(torch.add, [share[1] for share in shares])
        grad_bias = functools.reduce(torch.add, [share[2] for share in shares])
        return grad_x, grad_weight, grad_bias, None, None


class _ChunkedSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Training BatchNorm of ``chunks`` ranks' SyncBN in one process. Running statistics
    are not kept: ``bench verify`` compares losses and parameters."""

    chunks = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ChunkedNormalise.apply(x, self.weight, self.bias, self.chunks, self.eps)


def _per_chunk(forward, chunks: int, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([forward(part) for part in x.chunk(chunks)])


def as_rank_chunks(model: nn.Module, chunks: int) -> nn.Module:
    """``model`` computing each global batch as ``chunks`` ranks would (module docstring);
    its parameters, and their names, unchanged. Use it under autocast with the weight
    cache off."""

    def chunked(bn: nn.Module) -> nn.Module:
        layer = _ChunkedSyncBatchNorm(bn.num_features, bn.eps, bn.momentum, bn.affine,
                                      bn.track_running_stats)
        layer.chunks = chunks
        return layer

    model = replace_batchnorm(model, chunked, _ChunkedSyncBatchNorm)
    for layer in model.modules():
        if isinstance(layer, (nn.modules.conv._ConvNd, nn.Linear)):
            layer.forward = functools.partial(_per_chunk, layer.forward, chunks)
    return model
