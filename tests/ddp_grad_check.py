"""Run inside each rank by test_ddp_grads.py (started with torch.multiprocessing.spawn)."""

from __future__ import annotations

import copy
import gc
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import strategies
from bench.config.run_config import RunConfig
from bench.config.strategy_parts import Topology
from bench.models.resnet_cifar import resnet18_cifar
from strategies.precision import Precision


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    strategy = strategies.get("ddp-spawn")
    strategy.setup(Topology("cpu", gpus=world))
    try:
        torch.manual_seed(0)
        model = resnet18_cifar(width=0.125)
        local = copy.deepcopy(model)  # same weights, no DDP: this rank's own gradient
        ddp = strategy.wrap_model(model, syncbn=True,
                                  precision=Precision("fp32", strategy.device))
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
        images = torch.randn(8, 3, 32, 32, generator=gen)
        labels = torch.randint(0, 100, (8,), generator=gen)

        loss = torch.nn.functional.cross_entropy(ddp(images), labels)
        strategy.backward_step(loss, optimizer, Precision("fp32", strategy.device))
        # backward_step stepped the optimizer; DDP's grads are still in .grad
        ddp_grad = _flat_grads(ddp.module)

        local_loss = torch.nn.functional.cross_entropy(local(images), labels)
        local_loss.backward()
        own = _flat_grads(local)
        gathered = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(gathered, own)
        mean_grad = torch.stack(gathered).mean(0)

        params = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
        all_params = [torch.empty_like(params) for _ in range(world)]
        dist.all_gather(all_params, params)
        losses = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(losses, loss.detach())
        result = {
            "losses": [float(x) for x in losses],
            "grad_vs_mean_max_abs": float((ddp_grad - mean_grad).abs().max()),
            "grad_scale": float(mean_grad.abs().max()),
            "grad_vs_own_max_abs": float((ddp_grad - own).abs().max()),
            "param_spread_max_abs": float(
                max((p - all_params[0]).abs().max() for p in all_params)
            ),
            "params_moved": float((params - torch.cat(
                [p.detach().reshape(-1) for p in local.parameters()])).abs().max()),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        del ddp, optimizer  # the DDP wrapper must go before its process group
        gc.collect()
    finally:
        strategy.teardown()


def knobs_main(rank: int, world: int, port: int, out_dir: str, knobs: dict) -> None:
    """Wrap the model through the strategy with DDP knobs and report what DDP holds."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    options = RunConfig("ddp", gpus=world, cpu=True, width=0.125, **knobs).strategy_options
    strategy = strategies.get("ddp", options)
    strategy.setup(Topology("cpu", gpus=world))
    try:
        ddp = strategy.wrap_model(resnet18_cifar(width=0.125), syncbn=True,
                                  precision=Precision("fp32", strategy.device))
        seen = {
            "bucket_bytes_cap": ddp.bucket_bytes_cap,
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "static_graph": ddp.static_graph,
            "find_unused_parameters": ddp.find_unused_parameters,
            "broadcast_buffers": ddp.broadcast_buffers,
        }
        if rank == 0:
            Path(out_dir, "knobs.json").write_text(json.dumps(seen))
        del ddp
        gc.collect()
    finally:
        strategy.teardown()
