"""SyncBatchNorm over 2 ranks (gloo) against BatchNorm over the whole batch: output, input
gradient, weight and bias gradients, running statistics. On ``cuda:0`` shared by both
ranks, torch's ``nn.SyncBatchNorm``; with ``--cpu``, bench's own for CPU ranks
(strategies/cpu_syncbn.py), over two training steps (the running statistics' momentum).

Run by tests/test_gpu.py and tests/test_cpu_syncbn.py as its own process: ``python
tests/syncbn_shared_check.py PORT [--cpu] [--per-replica] [--bf16]``. Prints the largest
difference of each and exits 1 when one exceeds 1e-5 (``--per-replica``: plain BatchNorm in
each rank, the control the check must fail).

``--bf16``: the input in bf16 with float32 parameters, as autocast hands BatchNorm a
convolution's output. The output must be in bf16 and each element the exact normalisation
(float64, from the same bf16 input) correctly rounded: within half a bf16 unit in the last
place (plus 1e-6 of it, float32's own rounding), a bound torch's BatchNorm over the whole
batch meets (checked here too, as the control); the parameter gradients within 1e-5
(relative) of the exact ones."""

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


def rank_body(rank: int, port: int, device: str, per_replica: bool, results,
              bf16: bool = False) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(0)  # both ranks on one GPU
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, weights = batch()
    half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    sync = nn.SyncBatchNorm if device == "cuda" else CpuSyncBatchNorm
    layer = bn(nn.BatchNorm2d if per_replica else sync, device).train()
    if bf16:
        layer = layer.float()
    for _ in range(STEPS):  # the same batch again: the running statistics move twice
        mine = x[half].to(device, torch.bfloat16 if bf16 else x.dtype).requires_grad_()
        out = layer(mine)
        (out * weights[half].to(device)).sum().backward()
    grads = torch.cat([layer.weight.grad, layer.bias.grad])
    dist.all_reduce(grads)  # each rank holds its share of the parameter gradients
    results[rank] = {
        "out": out.detach().cpu(), "x_grad": mine.grad.cpu(), "param_grad": grads.cpu(),
        "mean": layer.running_mean.cpu(), "var": layer.running_var.cpu(),
    }
    dist.destroy_process_group()


def exact(x: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """BatchNorm of ``x`` over the whole batch in float64 with the check's parameters:
    the output and the weight and bias gradients of sum(out * weights), accumulated over
    the check's steps as the ranks accumulate them."""
    layer = bn(nn.BatchNorm2d, "cpu").train()
    for _ in range(STEPS):
        out = layer(x.double())
        (out * weights.double()).sum().backward()
    return {"out": out.detach(), "param_grad": torch.cat([layer.weight.grad,
                                                          layer.bias.grad])}


def half_ulp_misses(out: torch.Tensor, want: torch.Tensor) -> int:
    """Elements of bf16 ``out`` farther from the exact ``want`` than half a bf16 unit in
    the last place of ``want`` (plus 1e-6 of that unit)."""
    exponent = torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -126)))
    half_ulp = 2.0 ** (exponent - 8)  # bf16: 7 stored bits, the unit is 2^(e-7)
    return int(((out.double() - want).abs() > half_ulp * (1 + 1e-6)).sum())


def main_bf16(got: dict) -> int:
    x, weights = batch()
    want = exact(x.bfloat16(), weights.bfloat16())
    layer = bn(nn.BatchNorm2d, "cpu").float().train()  # the control: torch's own
    torch_out = layer(x.bfloat16())
    wrong = False
    for name, out in (("syncbn(2 ranks, cpu, bf16)", torch.cat([got[r]["out"]
                                                                  for r in range(WORLD)])),
                      ("torch BatchNorm (whole batch, bf16)", torch_out.detach())):
        if out.dtype != torch.bfloat16:
            print(f"{name}: output {out.dtype}, not bf16")
            wrong = True
            continue
        misses = half_ulp_misses(out, want["out"])
        print(f"{name}: output {out.dtype}, {misses} of {out.numel()} elements not "
              "correctly rounded")
        wrong = wrong or misses > 0
    grads = got[0]["param_grad"].double()
    diff = ((grads - want["param_grad"]).abs() / want["param_grad"].abs()).max().item()
    print(f"param_grad: max relative |syncbn(2 ranks, cpu, bf16) - exact| = {diff:.3g}")
    return 0 if not wrong and diff <= TOL else 1


def main() -> int:
    port = int(sys.argv[1])
    device = "cpu" if "--cpu" in sys.argv[2:] else "cuda"
    bf16 = "--bf16" in sys.argv[2:]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_body, args=(port, device, "--per-replica" in sys.argv[2:], results,
                                  bf16), nprocs=WORLD)
        got = {r: dict(results[r]) for r in range(WORLD)}
    if bf16:
        return main_bf16(got)
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
