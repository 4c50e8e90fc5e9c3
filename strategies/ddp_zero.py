"""DDP + ``ZeroRedundancyOptimizer`` (ZeRO stage 1): gradients all-reduced by DDP as usual,
then each rank keeps and applies the optimizer state of its own shard of the parameters only
and broadcasts the updated shard to the others. Optimizer memory drops by the world size;
the price is one more collective after every step, which backward cannot hide."""

from __future__ import annotations

import torch
from torch import nn

from strategies.base import SyncOff
from strategies.ddp import DDPStrategy, ddp_still_communicating


class DDPZeroStrategy(DDPStrategy):
    summary = "DDP + ZeroRedundancyOptimizer (optimizer state sharded: ZeRO-1)"

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module, *,
                       grad_accum: int) -> torch.optim.Optimizer:
        """The run's optimizer, sharded: the same class and recipe (``defaults``: lr,
        momentum, Nesterov, weight decay, implementation), built over each rank's shard."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        sharded = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(optimizer),
                                          **optimizer.defaults)
        mine = sum(p.numel() for group in sharded.optim.param_groups for p in group["params"])
        total = sum(p.numel() for p in model.parameters())
        self.notes.append(f"ZeroRedundancyOptimizer: this rank keeps the optimizer state of "
                          f"{mine:,} of {total:,} parameters ({mine / total:.0%})")
        return sharded

    def gradient_sync_off(self, model: nn.Module, optimizer) -> SyncOff | str:
        left = ddp_still_communicating(self.norm, self.ddp_options)
        zero = "the parameter broadcast after each step (ZeRO)"
        note = f"{left} and {zero}" if left else f"still communicating with sync off: {zero}"
        return SyncOff(model.no_sync(), note)
