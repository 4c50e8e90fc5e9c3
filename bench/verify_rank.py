"""The rank side of ``bench verify``: K steps, then rank 0 saves what the check compares
with its reference (per-step losses, final parameters, the BatchNorm grouping)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from bench.across_ranks import full_tensor
from bench.record import TrainStats
from strategies.base import Strategy

if TYPE_CHECKING:
    from bench.trainer import Trainer


def run_verify(trainer: Trainer) -> None:
    """bench verify: K steps, then rank 0 saves per-step losses and final parameters."""
    train = trainer.train_epoch(0)
    state = verify_state(trainer.parts.model)  # collective under FSDP: every rank
    if trainer.record is not None:
        save_verify_outputs(Path(trainer.cfg.verify_dir), train, state, trainer.strategy,
                            trainer.parts.precision.label, trainer.cfg.grad_accum,
                            trainer.parts.precision.scaler_state()["scaler_skipped_steps"])
        trainer.record.finish_verify(trainer.strategy.norm, trainer.strategy.notes)


def verify_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Final parameters of the unwrapped model (DP, DDP, apex), gathered whole, on CPU in
    their own dtype (float64 under bench verify's fp32 check)."""
    module = getattr(model, "module", model)
    return {k: full_tensor(v.detach()).cpu().clone() for k, v in module.named_parameters()}


def save_verify_outputs(out: Path, train: TrainStats, state: dict[str, torch.Tensor],
                        strategy: Strategy, precision: str, grad_accum: int,
                        scaler_skipped_steps: int | None = None) -> None:
    """What ``bench verify`` compares with its reference: per-step losses and parameters,
    and how the strategy cut the batch (its BatchNorm grouping)."""
    torch.save(state, out / "params.pt")
    (out / "losses.json").write_text(json.dumps({
        "losses": list(train.step_losses), "precision": precision, "norm": strategy.norm,
        "world_size": strategy.replicas, "processes": strategy.world_size,
        "grad_accum": grad_accum, "scaler_skipped_steps": scaler_skipped_steps,
    }))
