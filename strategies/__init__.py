"""Strategy registry: a name on the command line -> a fresh strategy object."""

from __future__ import annotations

from collections.abc import Callable

from bench.config import StrategyOptions
from strategies.apex import ApexStrategy
from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.ddp_amp import DDPAmpStrategy
from strategies.ddp_zero import DDPZeroStrategy
from strategies.dp import DataParallelStrategy
from strategies.fsdp import FSDPStrategy
from strategies.horovod import HorovodStrategy

# name -> factory; each factory takes the run's StrategyOptions and hands its strategy the
# part that is its own (DDP knobs, apex, Horovod), never the whole config.
REGISTRY: dict[str, Callable[[StrategyOptions], Strategy]] = {
    "dp": lambda o: DataParallelStrategy("dp"),
    "ddp": lambda o: DDPStrategy("ddp", ddp=o.ddp, launcher="torchrun"),
    "ddp-spawn": lambda o: DDPStrategy(
        "ddp-spawn", ddp=o.ddp, launcher="spawn",
        summary="DDP, ranks started by mp.spawn instead of torchrun",
    ),
    "ddp-launch": lambda o: DDPStrategy(
        "ddp-launch", ddp=o.ddp, launcher="torch.distributed.launch",
        summary="DDP, ranks by the deprecated launcher (--local-rank)",
    ),
    "ddp-amp": lambda o: DDPAmpStrategy("ddp-amp", ddp=o.ddp),
    "ddp-zero": lambda o: DDPZeroStrategy("ddp-zero", ddp=o.ddp),
    "ddp-apex": lambda o: ApexStrategy("ddp-apex", apex=o.apex, ddp=o.ddp),
    "horovod": lambda o: HorovodStrategy("horovod", options=o.horovod),
    "fsdp": lambda o: FSDPStrategy("fsdp", fsdp=o.fsdp),
}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str, options: StrategyOptions | None = None) -> Strategy:
    """A new strategy object with its own options (defaults when none are given); KeyError
    names the registered strategies."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown strategy {name!r}; choose one of: {', '.join(REGISTRY)}"
        ) from None
    return factory(options or StrategyOptions())


def srun_capable() -> list[str]:
    """The strategies whose ranks can be srun tasks."""
    return [name for name in REGISTRY if get(name).runs_as_srun_task]


__all__ = ["REGISTRY", "Strategy", "get", "names", "srun_capable"]
