"""SyncBatchNorm over 2 ranks (gloo) against BatchNorm over the whole batch: output, input
gradient, weight and bias gradients, running statistics. On ``cuda:0`` shared by both
ranks, torch's ``nn.SyncBatchNorm``; with ``--cpu``, bench's own for CPU ranks
(strategies/cpu_syncbn.py), over two training steps (the running statistics' momentum).

Run by tests/test_gpu.py and tests/test_cpu_syncbn.py as its own process: ``python
tests/syncbn_shared_check.py PORT [--cpu] [--per-replica]``. Prints the largest difference
of each and exits 1 when one exceeds 1e-5 (``--per-replica``: plain BatchNorm in each rank,
the control the check must fail)."""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from strategies.cpu_syncbn import CpuSyncBatchNorm

WORLD, BATCH, CHANNELS, TOL = 2, 16, 8, 1e-5
STEPS = 2


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, CHANNELS, 6, 6, generator=gen, dtype=torch.float64) * 3 + 1
    weights = torch.randn(BATCH, CHANNELS, 6, 6, generator=gen, dtype=torch.float64)
    return x, weights  # loss = sum(out * weights): gradients differ per element


def bn(cls, device: str) -> nn.Module:
    layer = cls(CHANNELS).double().to(device)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
        layer.bias.copy_(torch.linspace(-0.2, 0.2, CHANNELS))
    return layer


def rank_body(rank: int, port: int, device: str, per_replica: bool, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(0)  # both ranks on one GPU
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, weights = batch()
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    sync = nn.SyncBatchNorm if device == "cuda" else CpuSyncBatchNorm
    layer = bn(nn.BatchNorm2d if per_replica else sync, device).train()
    for _ in range(STEPS):  # the same batch again: the running statistics move twice
        mine = x[half].to(device).requires_grad_()
        out = layer(mine)
        (out * weights[half].to(device)).sum().backward()
    grads = torch.cat([layer.weight.grad, layer.bias.grad])
    dist.all_reduce(grads)  # each rank holds its share of the parameter gradients
    results[rank] = {
        "out": out.detach().cpu(), "x_grad": mine.grad.cpu(), "param_grad": grads.cpu(),
        "mean": layer.running_mean.cpu(), "var": layer.running_var.cpu(),
    }
    dist.destroy_process_group()


def main() -> int:
    port = int(sys.argv[1])
    device = "cpu" if "--cpu" in sys.argv[2:] else "cuda"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_body, args=(port, device, "--per-replica" in sys.argv[2:], results),
                 nprocs=WORLD)
        got = {r: dict(results[r]) for r in range(WORLD)}
    x, weights = batch()
    layer = bn(nn.BatchNorm2d, device).train()
    for _ in range(STEPS):  # a copy each step: x.to('cpu') is x, whose grad would add up
        whole = x.to(device).clone().requires_grad_()
        out = layer(whole)
        (out * weights.to(device)).sum().backward()
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
            if not torch.equal(have, got[1][name]):
                print(f"{name}: differs between ranks")
                worst = math.inf
        diff = (have - want).abs().max().item()
        worst = max(worst, diff)
        print(f"{name}: max |syncbn(2 ranks, {device}) - bn(whole batch)| = {diff:.3g}")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
