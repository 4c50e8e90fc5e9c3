"""`bench run`: train with one strategy and write its record (bench.launch.run does it)."""

from __future__ import annotations

import argparse

from bench.config.options import add_run_options, config_from_args

USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench run``'s options (``help``: its line in ``bench --help``)."""
    run = sub.add_parser("run", help=help)
    add_run_options(run)


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    from bench.launch.run import execute

    return execute(config_from_args(args), args.command_line)
