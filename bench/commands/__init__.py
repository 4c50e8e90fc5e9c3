"""One module per `bench X`, each with ``add_parser(sub, help)`` and ``main(args,
passed_on)``; bench.cli names them. The results folder the reading commands take is named
the same way by each (results_argument, results_source)."""

from __future__ import annotations

import argparse

from bench.tools.errors import ConfigError


def results_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The folder a reading command reads, given bare (``bench report r1``, as `bench
    compare` takes its two) or as ``--results DIR`` (what the docs and older scripts type).
    ``what``: the bare argument's help."""
    parser.add_argument("source", nargs="?", default=None, metavar="RESULTS", help=what)
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="the same as RESULTS (default results)")


def results_source(args: argparse.Namespace) -> str:
    """The folder named by results_argument's two spellings; naming two differs is an
    error, as guessing which was meant would read the wrong runs."""
    if args.source is not None and args.results is not None and args.source != args.results:
        raise ConfigError(f"two results given ({args.source} and --results {args.results}); "
                          "name one")
    return args.source or args.results or "results"
