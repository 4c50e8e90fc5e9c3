"""SyncBatchNorm over 2 ranks that share ``cuda:0`` (gloo) against BatchNorm over the whole
batch: output, input gradient, weight and bias gradients, running statistics.

Run by tests/test_gpu.py as its own process: ``python tests/syncbn_shared_check.py PORT``.
Prints the largest difference of each and exits 1 when one exceeds 1e-5."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD, BATCH, CHANNELS, TOL = 2, 16, 8, 1e-5


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, CHANNELS, 6, 6, generator=gen, dtype=torch.float64) * 3 + 1
    weights = torch.randn(BATCH, CHANNELS, 6, 6, generator=gen, dtype=torch.float64)
    return x, weights  # loss = sum(out * weights): gradients differ per element


def bn(cls) -> nn.Module:
    layer = cls(CHANNELS).double().cuda()
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
        layer.bias.copy_(torch.linspace(-0.2, 0.2, CHANNELS))
    return layer


def rank_body(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)  # both ranks on one GPU
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, weights = batch()
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    layer = bn(nn.SyncBatchNorm).train()
    mine = x[half].cuda().requires_grad_()
    out = layer(mine)
    (out * weights[half].cuda()).sum().backward()
    grads = torch.cat([layer.weight.grad, layer.bias.grad])
    dist.all_reduce(grads)  # each rank holds its share of the parameter gradients
    results[rank] = {
        "out": out.detach().cpu(), "x_grad": mine.grad.cpu(), "param_grad": grads.cpu(),
        "mean": layer.running_mean.cpu(), "var": layer.running_var.cpu(),
    }
    dist.destroy_process_group()


def main() -> int:
    port = int(sys.argv[1])
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_body, args=(port, results), nprocs=WORLD)
        got = {r: dict(results[r]) for r in range(WORLD)}
    x, weights = batch()
    layer = bn(nn.BatchNorm2d).train()
    whole = x.cuda().requires_grad_()
    out = layer(whole)
    (out * weights.cuda()).sum().backward()
    expected = {
        "out": out.detach().cpu(), "x_grad": whole.grad.cpu(),
        "param_grad": torch.cat([layer.weight.grad, layer.bias.grad]).cpu(),
        "mean": layer.running_mean.cpu(), "var": layer.running_var.cpu(),
    }
    worst = 0.0
    for name, want in expected.items():
        if name in ("out", "x_grad"):
            have = torch.cat([got[r][name] for r in range(WORLD)])
        else:  # the same on every rank
            have = got[0][name]
            assert torch.equal(have, got[1][name]), f"{name} differs between ranks"
        diff = (have - want).abs().max().item()
        worst = max(worst, diff)
        print(f"{name}: max |syncbn(2 ranks, cuda:0) - bn(whole batch)| = {diff:.3g}")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
