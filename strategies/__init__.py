"""Strategy registry: a name on the command line -> a fresh strategy object."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.config.strategy_parts import StrategyOptions

if TYPE_CHECKING:
    from strategies.base import Strategy


def _new(module: str, cls: str, *args: Any, **kwargs: Any) -> Strategy:
    """A new ``strategies.<module>.<cls>``, imported only now: the registry itself (its names,
    their order) imports no torch, so the report and the project read it."""
    return getattr(importlib.import_module(f"strategies.{module}"), cls)(*args, **kwargs)


# name -> factory, in the order every table lists them; each factory takes the run's
# StrategyOptions and hands its strategy the part that is its own (DDP knobs, apex, Horovod),
# never the whole config.
REGISTRY: dict[str, Callable[[StrategyOptions], Strategy]] = {
    "dp": lambda o: _new("dp", "DataParallelStrategy", "dp"),
    "ddp": lambda o: _new("ddp", "DDPStrategy", "ddp", ddp=o.ddp, launcher="torchrun"),
    "ddp-spawn": lambda o: _new("ddp", "DDPStrategy",
        "ddp-spawn", ddp=o.ddp, launcher="spawn",
        summary="DDP, ranks started by mp.spawn instead of torchrun",
    ),
    "ddp-launch": lambda o: _new("ddp", "DDPStrategy",
        "ddp-launch", ddp=o.ddp, launcher="torch.distributed.launch",
        summary="DDP, ranks by the deprecated launcher (--local-rank)",
    ),
    "ddp-amp": lambda o: _new("ddp_amp", "DDPAmpStrategy", "ddp-amp", ddp=o.ddp),
    "ddp-zero": lambda o: _new("ddp_zero", "DDPZeroStrategy", "ddp-zero", ddp=o.ddp),
    "ddp-apex": lambda o: _new("apex", "ApexStrategy", "ddp-apex", apex=o.apex, ddp=o.ddp),
    "horovod": lambda o: _new("horovod", "HorovodStrategy", "horovod", options=o.horovod),
    "fsdp": lambda o: _new("fsdp", "FSDPStrategy", "fsdp", fsdp=o.fsdp),
}


def names() -> list[str]:
    return list(REGISTRY)


def factory(name: str) -> Callable[[StrategyOptions], Strategy]:
    """What makes the strategy ``name`` (nothing is imported until it is called); KeyError
    names the registered strategies."""
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(REGISTRY), n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise KeyError(
            f"unknown strategy {name!r}; {hint}choose one of: {', '.join(REGISTRY)}"
        ) from None


def get(name: str, options: StrategyOptions | None = None) -> Strategy:
    """A new strategy object with its own options (defaults when none are given); KeyError
    names the registered strategies."""
    return factory(name)(options or StrategyOptions())


def srun_capable() -> list[str]:
    """The strategies whose ranks can be srun tasks."""
    return [name for name in REGISTRY if get(name).runs_as_srun_task]


__all__ = ["REGISTRY", "factory", "get", "names", "srun_capable"]
