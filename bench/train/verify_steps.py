"""The rank side of ``bench verify``: K steps, then rank 0 saves what the check compares
with its reference (per-step losses, final parameters, the BatchNorm grouping)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from bench.measure.across_ranks import full_tensor, global_mean, sync_devices
from bench.models.ghost_batchnorm import GhostBatchNorm
from strategies.base import Strategy

if TYPE_CHECKING:
    from bench.train.trainer import Trainer


def run_verify(trainer: Trainer) -> None:
    """bench verify: the first K steps of epoch 0 through the trainer's own ``train_step``
    (no timing, no evaluation), each step's loss reduced over the ranks in float64; then
    rank 0 saves the per-step losses and the final parameters."""
    strategy, cfg = trainer.strategy, trainer.cfg
    trainer.start_epoch(0)
    trainer.beat("train epoch 1 (waiting for the other ranks)")
    strategy.barrier()
    batches = ((images, labels) for images, labels, _ in trainer.loaders.train)
    losses = []
    for step in range(min(cfg.verify_steps, trainer.steps_per_epoch)):
        trainer.before_step(0, step)
        done = trainer.train_step(step, itertools.islice(batches, cfg.grad_accum),
                                  torch.float64)  # compared with the reference at 1e-8
        if not done.stepped:
            break
        losses.append(global_mean(strategy, torch.stack(done.loss_sums).sum(),
                                  trainer.split.per_process))
    sync_devices(strategy)
    state = verify_state(trainer.parts.model)  # collective under FSDP: every rank
    if trainer.record is not None:
        save_verify_outputs(Path(trainer.cfg.verify_dir), losses, state, trainer.strategy,
                            trainer.parts.precision.label, trainer.cfg.grad_accum,
                            trainer.parts.precision.scaler_state()["scaler_skipped_steps"],
                            ghost_group(trainer.parts.model))
        trainer.record.finish_verify(trainer.strategy.norm, trainer.strategy.notes)


def verify_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Final parameters of the unwrapped model (DP, DDP, apex), gathered whole, on CPU in
    their own dtype (float64 under bench verify's fp32 check)."""
    module = getattr(model, "module", model)
    return {k: full_tensor(v.detach()).cpu().clone() for k, v in module.named_parameters()}


def ghost_group(model: nn.Module) -> int | None:
    """The images a ghost BatchNorm group holds in the model the ranks trained (None: no
    ghost layer): read from the layers, as the grouping the reference must reproduce."""
    return next((m.group for m in model.modules() if isinstance(m, GhostBatchNorm)), None)


def save_verify_outputs(out: Path, losses: list[float], state: dict[str, torch.Tensor],
                        strategy: Strategy, precision: str, grad_accum: int,
                        scaler_skipped_steps: int | None = None,
                        ghost_bn: int | None = None) -> None:
    """What ``bench verify`` compares with its reference: per-step losses and parameters,
    and how the strategy cut the batch (its BatchNorm grouping)."""
    torch.save(state, out / "params.pt")
    (out / "losses.json").write_text(json.dumps({
        "losses": losses, "precision": precision, "norm": strategy.norm,
        "world_size": strategy.replicas, "processes": strategy.world_size,
        "grad_accum": grad_accum, "scaler_skipped_steps": scaler_skipped_steps,
        "ghost_bn": ghost_bn,
    }))
