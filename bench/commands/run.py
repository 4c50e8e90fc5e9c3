"""`bench run`: train with one strategy and write its record (bench.launch.run does it)."""

from __future__ import annotations

import argparse

from bench.config.options import add_run_options, config_from_args

USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench run``'s options (``help``: its line in ``bench --help``)."""
    run = sub.add_parser("run", help=help)
    add_run_options(run)


def check(args: argparse.Namespace, passed_on: list[str]) -> None:
    """What ``bench run`` refuses before torch loads (about 2 s of CPU a refusal): its options,
    its strategy's name and the test hooks' variables. The model, the devices and what the
    strategy needs are checked after, with torch (bench.launch.plan.RunPlan checks all)."""
    import strategies
    from bench.tools.errors import ConfigError
    from bench.tools.faults import Fault, defect_from_env

    cfg = config_from_args(args)
    cfg.validate()
    try:
        strategies.factory(cfg.strategy)  # the name only: making one imports torch
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    Fault.from_env()
    defect_from_env()


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    from bench.launch.run import execute

    return execute(config_from_args(args), args.command_line)
