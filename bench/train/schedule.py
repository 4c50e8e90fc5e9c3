"""What each optimizer step trains on: how the global batch is cut over replicas, processes
and accumulated micro-steps, and the learning rate of the step. The same for every strategy
and world size, so that they all do the same work."""

from __future__ import annotations

import math
from dataclasses import dataclass

from strategies.base import Strategy

EVAL_MIN_BATCH = 256  # images per process per evaluation batch, at least


def lr_at(step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """Linear warm-up from peak/warmup_steps to peak, then cosine decay to 0, per step."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * peak_lr * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class BatchSplit:
    """How the global batch is cut: per model replica, per process (DataParallel drives
    several replicas from one), and per micro-step of gradient accumulation."""

    per_replica: int
    per_process: int
    micro: int

    @classmethod
    def of(cls, global_batch: int, grad_accum: int, strategy: Strategy) -> BatchSplit:
        per_process = global_batch // strategy.world_size
        return cls(global_batch // strategy.replicas, per_process, per_process // grad_accum)

    @property
    def eval_batch(self) -> int:
        """Images per process per evaluation batch: the training batch, at least
        EVAL_MIN_BATCH (no gradients kept, so a larger batch fits)."""
        return max(EVAL_MIN_BATCH, self.per_process)
