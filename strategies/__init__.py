"""Strategy registry: a name on the command line -> a fresh strategy object."""

from __future__ import annotations

from collections.abc import Callable

from strategies.apex import ApexStrategy
from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.ddp_amp import DDPAmpStrategy
from strategies.dp import DataParallelStrategy
from strategies.fsdp import FSDPStrategy
from strategies.horovod import HorovodStrategy

REGISTRY: dict[str, Callable[[], Strategy]] = {
    "dp": lambda: DataParallelStrategy("dp"),
    "ddp": lambda: DDPStrategy(
        "ddp", launcher="torchrun", summary="DDP, ranks started by torchrun"
    ),
    "ddp-spawn": lambda: DDPStrategy(
        "ddp-spawn", launcher="spawn", summary="DDP, ranks started by torch.multiprocessing.spawn"
    ),
    "ddp-launch": lambda: DDPStrategy(
        "ddp-launch",
        launcher="torch.distributed.launch",
        summary="DDP, ranks started by the deprecated torch.distributed.launch (--local-rank)",
    ),
    "ddp-amp": lambda: DDPAmpStrategy("ddp-amp", launcher="torchrun"),
    "ddp-apex": lambda: ApexStrategy("ddp-apex", launcher="torchrun"),
    "horovod": lambda: HorovodStrategy("horovod"),
    "fsdp": lambda: FSDPStrategy("fsdp", launcher="torchrun"),
}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> Strategy:
    """A new strategy object; KeyError names the registered strategies."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown strategy {name!r}; choose one of: {', '.join(REGISTRY)}"
        ) from None
    return factory()


__all__ = ["REGISTRY", "Strategy", "get", "names"]
