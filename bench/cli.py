"""bench: which PyTorch data-parallel strategy is fastest on your hardware, and does it cost
accuracy? Each command is a module of bench/commands/ with ``add_parser(sub, help)`` and
``main(args, passed_on)``; this table names them, and only the one given is imported."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from types import ModuleType
from typing import NoReturn

from bench import __version__
from bench.config.options import BenchParser
from bench.tools.collector import pause_collector, resume_collector
from bench.tools.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    STOP_SIGNALS,
    BenchError,
    ConfigError,
    Interrupted,
    raise_interrupted,
    signals_held,
)

# `bench NAME` runs bench/commands/NAME.py; its line in `bench --help`.
COMMANDS = {
    "list": "registered strategies and whether they run here",
    "run": "train with one strategy and write a JSON record",
    "sweep": "every strategy x world size with one recipe (resumable)",
    "verify": "check that every strategy trains exactly like one plain process",
    "loader": "the input pipeline alone at each loader-worker count: how many --workers feed "
              "faster than the model trains",
    "slurm": "write (and optionally submit) an sbatch script for a multi-node run",
    "fit": "the largest batch a strategy trains at without running out of memory (on CPU "
           "under a real --memory-limit)",
    "parity": "the accuracy comparison's self-test: controls that share the math must come "
              "out equal, planted accuracy costs different (--self-test)",
    "compare": "compare two results (folders or record files); exit 1 on a regression",
    "probe": "all-reduce bandwidth (algbw, busbw) for a backend and world size: the comm "
             "ceiling the report compares runs with",
    "project": "each measured strategy at 8 to 4,096 GPUs on paper (a model; --validate shows "
               "its error on measured runs)",
    "report": "summarise records into tables",
}
DESCRIPTION = ("bench: which PyTorch data-parallel strategy is fastest on your hardware, and "
               "does it cost accuracy? Commands: " + ", ".join(COMMANDS) + ".")


class _Version(argparse.Action):
    """``bench --version``: this package's version and torch's (imported only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print bench's and torch's versions and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import torch

        print(f"bench {__version__} (torch {torch.__version__}, CUDA {torch.version.cuda})")
        parser.exit()


def build_parser(command: ModuleType | None = None) -> argparse.ArgumentParser:
    """Every command by name and help line; the options only of ``command``, the one given
    (the others' modules are not imported)."""
    parser = BenchParser(prog="bench", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=BenchParser)
    for name, help in COMMANDS.items():
        if command is not None and command.__name__ == f"bench.commands.{name}":
            command.add_parser(sub, help)
        else:
            sub.add_parser(name, help=help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for signum in STOP_SIGNALS:  # like Ctrl-C: exit 130 (not under a harness's own handler,
        if signal.getsignal(signum) is signal.SIG_DFL:  # nor where nohup ignores SIGHUP)
            signal.signal(signum, raise_interrupted)
    try:
        return _dispatch(argv)
    except (KeyboardInterrupt, Interrupted):
        print("bench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `bench report | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def entry() -> NoReturn:
    """The ``bench`` command and ``python -m bench``: ``main``, then an exit that skips the
    interpreter's teardown (bench.tools.quick_exit; ~0.8 s once torch is imported)."""
    from bench.tools.quick_exit import exit_now
    from bench.tools.streams import guard_standard_streams

    pause_collector()  # until the command's work begins (_dispatch; bench.tools.collector)
    guard_standard_streams()
    exit_now(main())


def checked_arguments(command: ModuleType | None,
                      argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``argv`` parsed for ``command`` (its module, or None for no known command), and
    refused as bench refuses bad input before torch loads: an option neither the command nor
    (where it passes them on) `bench run` knows, and the command's own ``check``. Returns
    the arguments and the options passed on; ConfigError names what is wrong."""
    args, passed_on = build_parser(command).parse_known_args(argv)
    if passed_on and not getattr(command, "PASSES_RUN_OPTIONS", False):
        raise ConfigError(f"unrecognized arguments: {' '.join(passed_on)}; "  # argparse
                          f"see `bench {args.command} --help`")  # would name `bench --help`
    if hasattr(command, "check"):  # bad input refused before torch loads
        command.check(args, passed_on)
    return args, passed_on


def _dispatch(argv: list[str]) -> int:
    try:
        command = None
        if argv and argv[0] in COMMANDS:
            with signals_held():  # a command module may import torch (see signals_held)
                command = importlib.import_module(f"bench.commands.{argv[0]}")
        args, passed_on = checked_arguments(command, argv)
        if getattr(command, "USES_TORCH", False):
            with signals_held():
                import torch  # noqa: F401
        args.command_line = ["bench", *argv]
        resume_collector()
        return command.main(args, passed_on)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
