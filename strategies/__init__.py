"""Strategy registry: a name on the command line -> a fresh strategy object."""

from __future__ import annotations

from collections.abc import Callable

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.dp import DataParallelStrategy

REGISTRY: dict[str, Callable[[], Strategy]] = {
    "dp": lambda: DataParallelStrategy("dp"),
    "ddp": lambda: DDPStrategy(
        "ddp", launcher="torchrun", summary="DDP, ranks started by torchrun"
    ),
    "ddp-spawn": lambda: DDPStrategy(
        "ddp-spawn", launcher="spawn", summary="DDP, ranks started by torch.multiprocessing.spawn"
    ),
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
